package server

import (
	"time"

	"github.com/meridian-router/meridian/control/signals"
	"github.com/meridian-router/meridian/policy"
)

// State is the introspection document served at /debug/state (and read by the dashboard):
// the model's inputs and its current solution. Fields that have no value yet are omitted.
type State struct {
	Version      string               `json:"version"`
	UpdatedAt    time.Time            `json:"updated_at"`
	Models       []string             `json:"models"`
	DefaultModel string               `json:"default_model"`
	Nodes        map[string]NodeState `json:"nodes"`
	Engines      []EngineState        `json:"engines"`
	Solver       *SolverState         `json:"solver,omitempty"`
}

// NodeState is one data-plane cluster.
type NodeState struct {
	Region string                    `json:"region"`
	Models map[string]NodeModelState `json:"models"`
	// Utilization is the planned load over capacity of the engines this node uses.
	Utilization float64      `json:"utilization"`
	RetryBudget *RetryBudget `json:"retry_budget,omitempty"`
	// DecisionsURL is the fleet file's clusters[].decisions_url (the sidecar's
	// /debug/decisions), when set.
	DecisionsURL string `json:"decisions_url,omitempty"`
}

// RetryBudget is the retry policy sent to the node's sidecars, and what it allows now.
type RetryBudget struct {
	MaxRetriesIdle uint32  `json:"max_retries_idle"`
	GenerousBelow  float64 `json:"generous_below"`
	ZeroAt         float64 `json:"zero_at"`
	RetryOn        string  `json:"retry_on"`
	// MaxRetriesNow is what the budget allows at the node's planned utilization.
	MaxRetriesNow uint32 `json:"max_retries_now"`
}

// NodeModelState is what one node does with one model's traffic.
type NodeModelState struct {
	// Weights are the published EDS weights by engine name; absent engines get nothing.
	Weights      map[string]uint32 `json:"weights"`
	DemandRPS    float64           `json:"demand_rps"`
	ShedFraction float64           `json:"shed_fraction"`
}

// EngineState is one engine's configuration and what the control server knows of it.
type EngineState struct {
	Name        string   `json:"name"`
	Region      string   `json:"region"`
	Address     string   `json:"address"`
	Models      []string `json:"models"`
	CapacityRPS float64  `json:"capacity_rps"`
	Draining    bool     `json:"draining"`
	// LoadRPS is the request rate the current solution sends it.
	LoadRPS   float64  `json:"load_rps"`
	TTFTP50Ms *float64 `json:"ttft_p50_ms,omitempty"`
	Penalty   *float64 `json:"penalty,omitempty"`
	// Suspect engines stopped reporting metrics (or fail): the solver gives them nothing
	// rather than treating them as idle.
	Suspect bool `json:"suspect"`
	// Signals is everything the control server learned of the engine: scraped vLLM
	// metrics, the sidecars' view, and the fitted latency curve the solver uses.
	Signals *signals.EngineState `json:"signals,omitempty"`
}

// SolverState describes the last solve.
type SolverState struct {
	SolveMs       float64   `json:"solve_ms"`
	Objective     float64   `json:"objective"`
	MeanLatencyMs float64   `json:"mean_latency_ms"`
	SolvedAt      time.Time `json:"solved_at"`
	// Error is the last solve's error, if it failed; the weights shown are the last good ones.
	Error string `json:"error,omitempty"`
}

// state assembles the introspection document.
func (s *Server) state() State {
	s.mu.Lock()
	f, res, snap, solveErr := s.fleet, s.last, s.snap, s.solveErr
	s.mu.Unlock()
	plan := s.pub.Plan()
	st := State{Version: s.pub.Version(), UpdatedAt: time.Now(), Nodes: map[string]NodeState{}}
	if f == nil {
		return st
	}
	st.DefaultModel = f.DefaultModel
	for _, m := range f.Models {
		st.Models = append(st.Models, m.Name)
	}
	load := map[string]float64{}
	shed := map[[2]string]float64{}
	if res != nil {
		sol := res.Solution
		for e, name := range sol.Engines {
			load[name] = sol.Load[e]
		}
		for _, node := range sol.Clusters {
			for _, model := range sol.Models {
				shed[[2]string{node, model}] = res.ShedFraction(node, model)
			}
		}
		st.Solver = &SolverState{
			SolveMs:       float64(sol.Duration.Microseconds()) / 1000,
			Objective:     sol.Objective,
			MeanLatencyMs: sol.MeanLatency * 1000,
			SolvedAt:      st.UpdatedAt,
		}
	}
	if solveErr != nil {
		if st.Solver == nil {
			st.Solver = &SolverState{}
		}
		st.Solver.Error = solveErr.Error()
	}
	for _, c := range f.Clusters {
		ns := NodeState{Region: c.Region, Models: map[string]NodeModelState{}, DecisionsURL: c.DecisionsURL}
		for _, m := range st.Models {
			w := map[string]uint32{}
			if plan != nil {
				for _, e := range plan.Assignments[c.Name][m] {
					if e.Priority == 0 {
						w[e.Engine] = e.Weight
					}
				}
			}
			ns.Models[m] = NodeModelState{Weights: w, DemandRPS: snap.Demand[c.Name][m], ShedFraction: shed[[2]string{c.Name, m}]}
		}
		if res != nil {
			if p := res.Policies[c.Name]; p != nil {
				ns.Utilization = p.GetUtilization()
				if b := p.GetRetryBudget(); b != nil {
					ns.RetryBudget = &RetryBudget{MaxRetriesIdle: b.GetMaxRetriesIdle(), GenerousBelow: b.GetGenerousBelow(),
						ZeroAt: b.GetZeroAt(), RetryOn: b.GetRetryOn()}
					if c, err := policy.CurveFromProto(b); err == nil {
						ns.RetryBudget.MaxRetriesNow = c.MaxRetries(ns.Utilization) // the sidecars' own arithmetic
					}
				}
			}
		}
		st.Nodes[c.Name] = ns
	}
	for _, e := range f.Engines {
		es := EngineState{Name: e.Name, Region: e.Region, Address: e.Address, Models: e.Models,
			CapacityRPS: e.CapacityRPS, Draining: e.Draining, LoadRPS: load[e.Name]}
		if v, ok := snap.Engines[e.Name]; ok {
			// The engine's own TTFT when it is scraped, else what the sidecars measured.
			ttft := v.TTFT
			if ttft == 0 {
				ttft = v.SidecarTTFT
			}
			ttftMs, pen := ttft*1000, v.Penalty
			es.TTFTP50Ms, es.Penalty, es.Suspect = &ttftMs, &pen, v.Suspect
			es.Signals = &v
		}
		st.Engines = append(st.Engines, es)
	}
	return st
}
