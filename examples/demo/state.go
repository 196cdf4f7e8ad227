package main

import (
	"maps"

	"github.com/meridian-router/meridian/control/server"
)

// Readers of the control server's /debug/state. A field the server does not report yet
// reads as absent (ok false), never as zero.

// weights are node's published EDS weights for model, by engine.
func weights(st *server.State, node, model string) map[string]uint32 {
	if st == nil {
		return nil
	}
	return maps.Clone(st.Nodes[node].Models[model].Weights)
}

// remoteWeightShare is the share of node's weight on engines outside its region.
func remoteWeightShare(st *server.State, topo *topology, node string) (float64, bool) {
	w := weights(st, node, topo.model)
	total, remote := 0.0, 0.0
	for e, v := range w {
		total += float64(v)
		if topo.region(e) != topo.nodeRegion(node) {
			remote += float64(v)
		}
	}
	if total == 0 {
		return 0, false
	}
	return remote / total, true
}

func engineState(st *server.State, engine string) (server.EngineState, bool) {
	if st == nil {
		return server.EngineState{}, false
	}
	for _, e := range st.Engines {
		if e.Name == engine {
			return e, true
		}
	}
	return server.EngineState{}, false
}

func penalty(st *server.State, engine string) (float64, bool) {
	e, ok := engineState(st, engine)
	if !ok || e.Penalty == nil {
		return 0, false
	}
	return *e.Penalty, true
}

// planLoad is the request rate the current solution sends engine; only a solver sets it.
func planLoad(st *server.State, engine string) (float64, bool) {
	e, ok := engineState(st, engine)
	if !ok || st.Solver == nil {
		return 0, false
	}
	return e.LoadRPS, true
}

// shedFraction is the share of node's demand the control server asks its sidecar to shed;
// only a solver sets it.
func shedFraction(st *server.State, node, model string) (float64, bool) {
	if st == nil || st.Solver == nil {
		return 0, false
	}
	return st.Nodes[node].Models[model].ShedFraction, true
}
