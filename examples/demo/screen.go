package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// liveWindow is the span the live summary's rates and percentiles cover.
const liveWindow = 5 * time.Second

// screen draws the live one-screen summary: redrawn in place on a terminal, a compact
// line every few seconds otherwise (so a log stays readable).
type screen struct {
	w        io.Writer
	tty      bool
	plan     *plan
	network  string
	links    string // where to look: the dashboard and the Envoys
	lastLine time.Time
}

// draw renders the summary at offset elapsed into the run.
func (sc *screen) draw(elapsed time.Duration, col *collector, obs observation) {
	now := time.Now()
	recent := col.filter(func(r result) bool { return now.Sub(r.done) <= liveWindow })
	i := sc.plan.phaseAt(elapsed)
	if !sc.tty {
		if now.Sub(sc.lastLine) >= 5*time.Second {
			sc.lastLine = now
			fmt.Fprintln(sc.w, sc.line(elapsed, i, recent))
		}
		return
	}
	var b strings.Builder
	b.WriteString("\x1b[H\x1b[2J")
	sc.header(&b, elapsed, i, obs)
	sc.entryTable(&b, recent)
	sc.engineTable(&b, recent, obs)
	sc.guards(&b, recent, obs)
	io.WriteString(sc.w, b.String())
}

func (sc *screen) header(b *strings.Builder, elapsed time.Duration, i int, obs observation) {
	p := sc.plan
	frac := min(1, elapsed.Seconds()/p.duration.Seconds())
	bar := strings.Repeat("#", int(frac*30)) + strings.Repeat(".", 30-int(frac*30))
	fmt.Fprintf(b, "meridian demo  [%s] %3.0f%%  %s / %s   (Ctrl-C stops everything)\n", bar, frac*100,
		elapsed.Truncate(time.Second), p.duration)
	fmt.Fprintf(b, "phase %d/%d  %-12s %s\n", i+1, len(story), story[i].name, story[i].what)
	fmt.Fprintf(b, "network: %s\n%s\n", sc.network, sc.links)
	switch {
	case obs.State == nil:
		fmt.Fprintf(b, "control server: no state yet (%v)\n", obs.StateErr)
	case obs.State.Solver == nil:
		fmt.Fprintf(b, "control server: snapshot %s, static weights (no solver reported)\n", obs.State.Version)
	default:
		fmt.Fprintf(b, "control server: snapshot %s, solver %.1f ms\n", obs.State.Version, obs.State.Solver.SolveMs)
	}
	fmt.Fprintf(b, "\nby entry region (last %s)\n", liveWindow)
}

func (sc *screen) entryTable(b *strings.Builder, recent []result) {
	topo := sc.plan.topo
	fmt.Fprintf(b, "  %-10s %9s %7s %7s %6s %9s %9s %7s\n", "region", "offered/s", "ok/s", "shed/s", "err", "TTFT p50", "TTFT p99", "remote")
	for _, node := range topo.nodeNames() {
		s := summarize(filterNode(recent, node), liveWindow, topo)
		fmt.Fprintf(b, "  %-10s %9.1f %7.1f %7.1f %6d %7.0fms %7.0fms %6.0f%%\n", node, s.OfferedRPS, s.OKRPS, s.ShedRPS,
			s.Errors, s.TTFTP50Ms, s.TTFTP99Ms, 100*s.RemoteShare)
	}
}

func (sc *screen) engineTable(b *strings.Builder, recent []result, obs observation) {
	topo := sc.plan.topo
	all := summarize(recent, liveWindow, topo)
	fmt.Fprintf(b, "\nengines (served/s and TTFT: last %s; penalty, plan load and weights: control server)\n", liveWindow)
	fmt.Fprintf(b, "  %-6s %-6s %9s %9s %8s %10s", "engine", "region", "served/s", "TTFT p50", "penalty", "plan load")
	nodes := topo.nodeNames()
	for _, n := range nodes {
		fmt.Fprintf(b, " %10s", "w "+n)
	}
	b.WriteString("\n")
	for _, e := range topo.engineNames() {
		fmt.Fprintf(b, "  %-6s %-6s %9.1f %7.0fms %8s %10s", e, topo.region(e),
			float64(all.Engines[e])/liveWindow.Seconds(), all.EngineTTFTP50Ms[e],
			optional(penalty(obs.State, e))("%.2f"), optional(planLoad(obs.State, e))("%.1f/s"))
		for _, n := range nodes {
			fmt.Fprintf(b, " %10s", weightShare(obs, topo, n, e))
		}
		b.WriteString("\n")
	}
}

func (sc *screen) guards(b *strings.Builder, recent []result, obs observation) {
	topo := sc.plan.topo
	b.WriteString("\nretries (Envoy):")
	for _, n := range topo.nodeNames() {
		r := obs.RetryRates[n]
		fmt.Fprintf(b, "  %s %.1f/s, refused by budget %.1f/s", n, r.Retries, r.Overflow)
	}
	all := summarize(recent, liveWindow, topo)
	b.WriteString("\nshed (client):  ")
	for _, c := range classes {
		fmt.Fprintf(b, "  %s %.0f%%", c.name, 100*all.ShedByClass[c.name])
	}
	b.WriteString("\nshed fraction asked by the control server:")
	for _, n := range topo.nodeNames() {
		fmt.Fprintf(b, "  %s %s", n, optional(shedFraction(obs.State, n, topo.model))("%.2f"))
	}
	b.WriteString("\n")
}

// line is the non-terminal progress line.
func (sc *screen) line(elapsed time.Duration, i int, recent []result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%5.0fs %-11s", elapsed.Seconds(), story[i].name)
	for _, node := range sc.plan.topo.nodeNames() {
		s := summarize(filterNode(recent, node), liveWindow, sc.plan.topo)
		fmt.Fprintf(&b, " | %s %.1f/s ok %.1f shed %.1f TTFT p50 %.0fms p99 %.0fms remote %.0f%%", node, s.OfferedRPS,
			s.OKRPS, s.ShedRPS, s.TTFTP50Ms, s.TTFTP99Ms, 100*s.RemoteShare)
	}
	return b.String()
}

func filterNode(rs []result, node string) []result {
	var out []result
	for _, r := range rs {
		if r.node == node {
			out = append(out, r)
		}
	}
	return out
}

// weightShare is engine's share of node's published weight, "–" when it is left out.
func weightShare(obs observation, topo *topology, node, engine string) string {
	w := weights(obs.State, node, topo.model)
	total := 0.0
	for _, v := range w {
		total += float64(v)
	}
	if total == 0 || w[engine] == 0 {
		return "–"
	}
	if share := float64(w[engine]) / total; share < 0.1 {
		return fmt.Sprintf("%.1f%%", 100*share)
	}
	return fmt.Sprintf("%.0f%%", 100*float64(w[engine])/total)
}

// optional formats a value the control server may not report: "–" when absent.
func optional(v float64, ok bool) func(format string) string {
	return func(format string) string {
		if !ok {
			return "–"
		}
		return fmt.Sprintf(format, v)
	}
}
