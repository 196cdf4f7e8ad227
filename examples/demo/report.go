package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// report is the demo's outcome, printed as text and optionally written as JSON.
type report struct {
	DurationS   float64       `json:"duration_s"`
	Network     string        `json:"network"`
	Interrupted bool          `json:"interrupted"`
	Phases      []phaseReport `json:"phases"`
	Findings    []string      `json:"findings"`
}

// phaseReport is what happened in one phase. Stats count requests by when they were sent;
// the control server's view (weights, penalties, shed fractions) is as of the phase's end.
type phaseReport struct {
	Name       string           `json:"name"`
	What       string           `json:"what"`
	StartS     float64          `json:"start_s"`
	EndS       float64          `json:"end_s"`
	SlowEngine string           `json:"slow_engine,omitempty"`
	All        stats            `json:"all"`
	Nodes      map[string]stats `json:"nodes"`
	// Snapshot is the control server's snapshot version at the phase's end.
	Snapshot          string                       `json:"snapshot"`
	Solver            bool                         `json:"solver"`
	Weights           map[string]map[string]uint32 `json:"weights"`
	RemoteWeightShare map[string]float64           `json:"remote_weight_share"`
	Penalties         map[string]float64           `json:"penalties,omitempty"`
	ShedFraction      map[string]float64           `json:"shed_fraction,omitempty"`
	// Retries are the Envoys' retry counters during the phase, by node.
	Retries map[string]retryStats `json:"retries"`
}

// closePhase builds phase i's report from the requests sent during it and the control
// server's state now; retriesBefore are the Envoy counters at the phase's start.
func closePhase(p *plan, i int, col *collector, obs observation, retriesBefore map[string]retryStats) phaseReport {
	from, to := p.starts[i], p.starts[i+1]
	sent := col.filter(func(r result) bool { return r.sent >= from && r.sent < to })
	topo := p.topo
	pr := phaseReport{Name: story[i].name, What: story[i].what, StartS: from.Seconds(), EndS: to.Seconds(),
		All: summarize(sent, to-from, topo), Nodes: map[string]stats{}, Weights: map[string]map[string]uint32{},
		RemoteWeightShare: map[string]float64{}, Penalties: map[string]float64{}, ShedFraction: map[string]float64{},
		Retries: map[string]retryStats{}}
	if story[i].slowFactor > 0 {
		pr.SlowEngine = p.slow
	}
	if obs.State != nil {
		pr.Snapshot, pr.Solver = obs.State.Version, obs.State.Solver != nil
	}
	for _, n := range topo.nodeNames() {
		pr.Nodes[n] = summarize(filterNode(sent, n), to-from, topo)
		pr.Weights[n] = weights(obs.State, n, topo.model)
		if v, ok := remoteWeightShare(obs.State, topo, n); ok {
			pr.RemoteWeightShare[n] = round(v, 3)
		}
		if v, ok := shedFraction(obs.State, n, topo.model); ok {
			pr.ShedFraction[n] = v
		}
		after, before := obs.Retries[n], retriesBefore[n]
		pr.Retries[n] = retryStats{Retries: after.Retries - before.Retries, Overflow: after.Overflow - before.Overflow,
			Requests: after.Requests - before.Requests}
	}
	for _, e := range topo.engineNames() {
		if v, ok := penalty(obs.State, e); ok {
			pr.Penalties[e] = v
		}
	}
	return pr
}

// print writes the report as text.
func (r *report) print(w io.Writer, topo *topology) {
	fmt.Fprintf(w, "\n== meridian demo report (%.0fs of traffic%s) ==\n", r.DurationS, map[bool]string{true: ", interrupted", false: ""}[r.Interrupted])
	fmt.Fprintf(w, "network: %s\n\n", r.Network)
	fmt.Fprintf(w, "%-12s %-9s %9s %6s %6s %6s %9s %9s %7s %8s\n", "phase", "region", "offered/s", "ok", "shed", "errors",
		"TTFT p50", "TTFT p99", "remote", "w remote")
	for _, ph := range r.Phases {
		for _, n := range topo.nodeNames() {
			s := ph.Nodes[n]
			wr := "–"
			if v, ok := ph.RemoteWeightShare[n]; ok {
				wr = fmt.Sprintf("%.0f%%", 100*v)
			}
			fmt.Fprintf(w, "%-12s %-9s %9.1f %5.0f%% %5.0f%% %6d %7.0fms %7.0fms %6.0f%% %8s\n", ph.Name, n, s.OfferedRPS,
				pctOf(s.OK, s.Requests), pctOf(s.Shed, s.Requests), s.Errors, s.TTFTP50Ms, s.TTFTP99Ms, 100*s.RemoteShare, wr)
		}
	}
	fmt.Fprintln(w, "\n(requests are counted in the phase they were sent in; ok and shed are shares of them;")
	fmt.Fprintln(w, " remote: share of the region's answered requests served by the other region's engines;")
	fmt.Fprintln(w, " w remote: share of the region's published EDS weight on them, at the phase's end)")
	fmt.Fprintln(w, "\nwhat happened:")
	for _, f := range r.Findings {
		fmt.Fprintf(w, "  - %s\n", f)
	}
}

// findings turns the phases into sentences. Each states what was measured; where the
// system did not react (for example weights that stayed static), it says so.
func findings(p *plan, phases []phaseReport) []string {
	byName := map[string]phaseReport{}
	for _, ph := range phases {
		byName[ph.Name] = ph
	}
	var out []string
	for _, f := range []func(*plan, map[string]phaseReport) string{surgeFinding, slowFinding, overloadFinding, recoveryFinding} {
		if s := f(p, byName); s != "" {
			out = append(out, s)
		}
	}
	return append(out, retryFinding(phases))
}

func surgeFinding(p *plan, ph map[string]phaseReport) string {
	steady, okS := ph["steady"]
	surge, okG := ph["surge"]
	if !okS || !okG {
		return ""
	}
	busy := p.topo.nodes[0].Name
	s := fmt.Sprintf("surge: %s offered %.1f req/s against %.0f req/s of local capacity; %.0f%% of its answered requests were served by remote engines (steady: %.0f%%), TTFT p50 %.0f ms (steady %.0f ms). ",
		busy, surge.Nodes[busy].OfferedRPS, p.topo.localCapacity(busy)*p.scale, 100*surge.Nodes[busy].RemoteShare,
		100*steady.Nodes[busy].RemoteShare, surge.Nodes[busy].TTFTP50Ms, steady.Nodes[busy].TTFTP50Ms)
	before, after := steady.RemoteWeightShare[busy], surge.RemoteWeightShare[busy]
	switch {
	case steady.Snapshot == surge.Snapshot:
		return s + fmt.Sprintf("Its weights did not change (%.0f%% on remote engines; snapshot %s throughout): no solver published new weights.", 100*after, surge.Snapshot)
	default:
		return s + fmt.Sprintf("Its remote weight share went from %.0f%% to %.0f%% (snapshot %s -> %s).", 100*before, 100*after, steady.Snapshot, surge.Snapshot)
	}
}

func slowFinding(p *plan, ph map[string]phaseReport) string {
	slow, ok := ph["slow engine"]
	steady := ph["steady"]
	if !ok {
		return ""
	}
	e := slow.SlowEngine
	var peers []float64
	for _, name := range p.topo.engineNames() {
		if name != e && p.topo.region(name) == p.topo.region(e) {
			if v, ok := slow.All.EngineTTFTP50Ms[name]; ok {
				peers = append(peers, v)
			}
		}
	}
	slices.Sort(peers)
	peer := 0.0
	if len(peers) > 0 {
		peer = peers[len(peers)/2]
	}
	s := fmt.Sprintf("slow engine: %s was slowed %gx; its TTFT p50 was %.0f ms against %.0f ms for its regional peers, and it served %.0f%% of all answered requests (steady: %.0f%%). ",
		e, story[slices.IndexFunc(story, func(x phase) bool { return x.name == "slow engine" })].slowFactor,
		slow.All.EngineTTFTP50Ms[e], peer, 100*share(slow.All, e), 100*share(steady.All, e))
	if v, ok := slow.Penalties[e]; ok {
		return s + fmt.Sprintf("The control server reported its penalty as %.2f at the phase's end.", v)
	}
	return s + "The control server's /debug/state reported no penalty for it."
}

func share(s stats, engine string) float64 {
	if s.OK == 0 {
		return 0
	}
	return float64(s.Engines[engine]) / float64(s.OK)
}

func overloadFinding(p *plan, ph map[string]phaseReport) string {
	o, ok := ph["overload"]
	if !ok {
		return ""
	}
	s := fmt.Sprintf("overload: %.1f req/s offered to %.0f req/s of fleet capacity; %.0f%% answered, %.0f%% shed (503), %d errors, TTFT p50 %.0f ms, p99 %.0f ms. ",
		o.All.OfferedRPS, p.topo.totalCapacity()*p.scale, pctOf(o.All.OK, o.All.Requests), pctOf(o.All.Shed, o.All.Requests),
		o.All.Errors, o.All.TTFTP50Ms, o.All.TTFTP99Ms)
	if o.All.Shed == 0 {
		return s + "Nothing was shed: the excess queued at the engines."
	}
	var parts []string
	for _, c := range classes {
		parts = append(parts, fmt.Sprintf("%s (priority %d) %.0f%%", c.name, c.priority, 100*o.All.ShedByClass[c.name]))
	}
	return s + "Shed by class: " + strings.Join(parts, ", ") + "."
}

func recoveryFinding(_ *plan, ph map[string]phaseReport) string {
	r, ok := ph["recovery"]
	steady := ph["steady"]
	if !ok {
		return ""
	}
	return fmt.Sprintf("recovery: TTFT p50 %.0f ms and p99 %.0f ms (steady: %.0f ms and %.0f ms), %.0f%% shed, %d errors.",
		r.All.TTFTP50Ms, r.All.TTFTP99Ms, steady.All.TTFTP50Ms, steady.All.TTFTP99Ms, pctOf(r.All.Shed, r.All.Requests), r.All.Errors)
}

func retryFinding(phases []phaseReport) string {
	var retries, overflow, requests float64
	for _, ph := range phases {
		for _, r := range ph.Retries {
			retries += r.Retries
			overflow += r.Overflow
			requests += r.Requests
		}
	}
	return fmt.Sprintf("retries: the Envoys retried %.0f of %.0f upstream requests; the retry budget refused %.0f.", retries, requests, overflow)
}

func seconds(d time.Duration) float64 { return round(d.Seconds(), 1) }

func pctOf(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}
