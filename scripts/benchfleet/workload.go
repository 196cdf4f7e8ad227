package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-router/meridian/sim/engine"
	"github.com/meridian-router/meridian/sim/trace"
)

// workload is the time-scaled subset every configuration replays.
type workload struct {
	sub     []trace.Request // the subset as the trace has it, arrivals from 0
	reqs    []trace.Request // arrivals already scaled to the offered rate (wall time)
	regions []int           // region index of each request
	// coldService is the subset's mean engine seconds per request with no cache hit, at
	// the engine model's own speed (engine.Config.ServiceSeconds, as the simulator's).
	coldService float64
	// prefillShare is the part of that time spent in prefill: the fleet file's
	// prefill_share, as the simulator states it.
	prefillShare float64
	// capacity and offered are the fleet's cold capacity and the offered rate, in wall
	// requests/s (both include the speed-up).
	capacity, offered float64
	span              time.Duration
	upperBound        float64
}

// buildWorkload takes o.requests consecutive requests of the trace, rescales them to o.load
// times the fleet's cold capacity, speeds them up by o.speed and assigns each to a region.
func buildWorkload(o options) (*workload, error) {
	format, err := trace.ParseFormat(o.traceFormat)
	if err != nil {
		return nil, fmt.Errorf("--trace-format: %w", err)
	}
	all, err := trace.ReadFile(o.tracePath, format)
	if err != nil {
		return nil, err
	}
	from := o.offset
	if from < 0 {
		from = len(all) - o.requests
	}
	if from < 0 || from+o.requests > len(all) {
		return nil, fmt.Errorf("%s holds %d requests: no %d from index %d (see --requests and --offset)", o.tracePath, len(all), o.requests, from)
	}
	sub := slices.Clone(all[from : from+o.requests])
	start := sub[0].Arrival
	for i := range sub {
		sub[i].Arrival -= start
	}
	w := &workload{sub: sub}
	cfg := engine.A100Llama8B(trace.BlockTokens)
	prefill := 0.0
	for _, r := range sub {
		w.coldService += cfg.ServiceSeconds(r.InputTokens, max(r.OutputTokens, 1))
		prefill += float64(r.InputTokens) / cfg.PrefillTokensPerSec
	}
	w.prefillShare = prefill / w.coldService
	w.coldService /= float64(len(sub))
	engines := o.regions * o.perRegion
	w.capacity = float64(engines) / w.coldService * o.speed
	w.offered = o.load * w.capacity
	if w.reqs, err = trace.WithRate(sub, w.offered); err != nil {
		return nil, fmt.Errorf("rescale %s to %.2f req/s: %w", o.tracePath, w.offered, err)
	}
	w.span = w.reqs[len(w.reqs)-1].Arrival
	w.upperBound = trace.Summarize(w.reqs).HitRateUpperBound
	for i, r := range w.reqs {
		w.regions = append(w.regions, regionOf(r, i, o.regions, o.seed))
	}
	return w, nil
}

// regionOf is where a request enters, as the simulator assigns it (sim.Config.newRequest):
// a conversation (same first block, or the session the trace names) always enters through
// the same region.
func regionOf(r trace.Request, index, regions int, seed uint64) int {
	conv := uint64(index) | 1<<63
	if len(r.HashIDs) > 0 {
		conv = r.HashIDs[0]
	}
	if r.Conversation != 0 {
		conv = r.Conversation
	}
	return int(mix(conv, seed^0x5eed) % uint64(regions))
}

// mix is the simulator's (sim.mix): xxhash of x and seed, little-endian.
func mix(x, seed uint64) uint64 {
	var b [16]byte
	for i := range 8 {
		b[i] = byte(x >> (8 * i))
		b[8+i] = byte(seed >> (8 * i))
	}
	return xxhash.Sum64(b[:])
}
