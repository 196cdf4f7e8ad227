package picker

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Endpoint is one engine as the table sees it.
type Endpoint struct {
	// Address is "ip:port", the string Envoy's override_host expects. It identifies the
	// endpoint: its hash ranking and its in-flight counter are keyed by it.
	Address string
	// Engine is the engine's name (EDS endpoint metadata), carried for reporting.
	Engine string
	// Weight is the EDS weight times the local penalty factor. It must be finite and
	// not negative; 0 leaves the endpoint out of the table. Only ratios matter.
	Weight float64
	// MaxInFlight is a hard cap on this endpoint's in-flight requests; 0 means
	// Config.MaxInFlight applies.
	MaxInFlight int64
	// Overflow marks an engine outside the key ranking (one the node gives no share): Pick
	// sends a request there only when the engine it chose would queue the request and the
	// overflow engine would not (see Config.OverflowAt). Weight is ignored.
	Overflow bool
}

// Limits of the table layout.
const (
	// MaxEndpoints is the most endpoints a table holds (candidates are stored as uint16).
	MaxEndpoints = math.MaxUint16
	// MaxCandidatesPerBucket bounds Config.Candidates.
	MaxCandidatesPerBucket = 8
	// MaxExamined bounds Config.MaxExamined (the per-pick scratch space lives on the stack).
	MaxExamined = 64
)

// Config shapes a table. Start from DefaultConfig; NewTable never fills in defaults.
type Config struct {
	// Buckets is the number of key buckets, a power of two in [2^8, 2^24]. Every sidecar
	// must use the same value, or the same key maps differently. Shares are quantized to
	// 1/Buckets: an endpoint with share s gets s×Buckets buckets, give or take
	// sqrt(s×Buckets). Memory is Buckets × Candidates × 2 bytes.
	Buckets int
	// Candidates is how many ranked endpoints each bucket stores, in [1, 8]. Picks that
	// need more walk on to the following buckets.
	Candidates int
	// Fallbacks is how many endpoints follow the primary in the list Pick returns (the
	// engines a retry may go to). DefaultFallbacks is the shipped value.
	Fallbacks int
	// Choices is how many endpoints the least-work choice weighs: the key's first Choices
	// endpoints within their bound, in [Fallbacks+1, MaxExamined]. The list Pick returns
	// is the chosen one, then the key's others in order, cut to Fallbacks+1.
	// DefaultChoices is the shipped value.
	Choices int
	// Epsilon is the bounded-load slack ε > 0: an endpoint takes a new request only
	// while its in-flight count is below (1+ε) × its weighted share of all in-flight
	// requests (counting the new one). DefaultEpsilon is the shipped value.
	Epsilon float64
	// SpillFloor is the outstanding work (in Pick's unit) below which an endpoint keeps
	// its keys: neither bounded loads nor the least-work choice move a key off it. With
	// little in flight the shares round to nothing and bounded loads scatter a prefix's
	// concurrent requests, giving up their KV-cache reuse; a floor keeps them together,
	// and keeps a conversation's next turn on its engine while the previous turn's outcome
	// is still on its way (the access log arrives after the client has its answer). The
	// sidecar sets it to picker.spill_floor short requests' work (spill_floor ×
	// decode_work_tokens), so a few short requests stay together and one long prompt is
	// already past it. 0 disables the floor. docs/results/README.md has the capacity
	// measured with other floors.
	SpillFloor int64
	// MaxInFlight is the default hard per-endpoint cap; 0 means no cap. An endpoint at
	// its cap is never returned, and when every examined endpoint is at its cap Pick
	// reports AtLimit so the caller can shed.
	MaxInFlight int64
	// MaxExamined bounds how many distinct endpoints one Pick examines, in
	// [Choices, 64]. It bounds the cost of a pick when most endpoints are loaded.
	MaxExamined int
	// OverflowAt is the fraction of an engine's KV cache (in tokens, as its scrape states
	// it) that its work may fill before a request overflows: when the primary's work
	// (its own requests' plus what others were last observed to hold), with the
	// request's, passes OverflowAt × its KV capacity, the request goes to the overflow
	// endpoint (Endpoint.Overflow) that would hold the least work after taking it, if that
	// is below what the primary would hold and its own KV capacity is known; one that is
	// not the key's home is charged the move cost, or the request's work if that is more
	// (it caches none of the prompt). A key at home on an overflow endpoint whose cache
	// has room for the prompt (Ask.Prompt) passes the threshold whatever the primary's
	// work: the home alone is weighed against the primary, which is charged the move
	// (the package doc's Overflow). 0 turns overflow off.
	// DefaultOverflowAt is the shipped value.
	OverflowAt float64
	// RoomWait bounds how long a key's home may keep a request waiting for room in its KV
	// cache before the key's move cost stops protecting it (the package doc's Room): when
	// the home's running requests, at the rate they free tokens as they finish
	// (Observation.KVFreed), would take longer than this to leave room for the prompt,
	// or the home has finished nothing lately, leaving it costs at most a cache's worth
	// of work, what the home itself is charged for having no room. 0 turns this off.
	// DefaultRoomWait is the shipped value.
	RoomWait time.Duration
}

// DefaultRoomWait is the shipped Config.RoomWait. A prompt that waits for room waits on
// the decode of the requests ahead of it. Long agentic sessions on one engine free their
// blocks tens of seconds apart, and bursts of short requests free a cache within a second
// or two. On the simulator (docs/results/README.md), 10 s moved the agentic sessions off
// homes that made them wait and left every Mooncake scan level; 5 s or less cost the
// Mooncake trace's bursts with A100 engines up to half a point.
const DefaultRoomWait = 10 * time.Second

// MaxRoomWait bounds Config.RoomWait.
const MaxRoomWait = 10 * time.Minute

// DefaultOverflowAt is the shipped overflow threshold. An engine's KV cache, in tokens, is
// about proportional to its prefill rate across GPUs (an A100 40GB holds 157k tokens of
// Llama-3.1-8B and prefills 9,700 tokens/s; an H100 80GB 452k and 30,800), so a fraction
// of it is about a time: at 0.2 an engine holds some 3 s of prefill work, past which a
// long prompt's first token misses the SLO. On the simulator (docs/results/README.md),
// over fixed loads near capacity, 0.05 to 0.2 met the SLO for the most requests on the
// Mooncake trace at both GPU profiles, 0.2 reached the highest capacity per region, and
// the Azure trace's capacity did not change.
const DefaultOverflowAt = 0.2

// MaxOverflowAt bounds Config.OverflowAt: past a few caches' worth of queued work a
// request waits for seconds before it overflows.
const MaxOverflowAt = 4

// DefaultEpsilon is the shipped bounded-load slack. The bound counts only this
// process's own work, and a sidecar has a few LLM requests in flight, each up to a
// hundred thousand tokens: at ε 0.25 one prompt in flight on a key's home already puts
// the home past its bound, and the key's next turn leaves its cache. At 1 an engine may
// hold twice its share of the sidecar's own work before a key spills by the bound alone;
// the least-work choice, which sees the whole engine, does the balancing. On the
// simulator (docs/results/README.md) 1 gave more capacity at the SLO than 0.25 on the
// Mooncake trace at both GPU profiles and the same on the Azure trace; with the warm-up
// skipped over cold caches and a move priced at 6 prompts, 2 (an engine may hold three
// times its share) kept more conversations with their cache on H100 engines, the same on
// A100 and Azure, and values from 2 to 8 measured alike.
const DefaultEpsilon = 2.0

// DefaultFallbacks is the shipped number of fallbacks: the least-work choice weighs a
// key's first four engines (a region of four engines, all of them). On the simulator
// (docs/results/README.md) four candidates met the SLO for more requests than three near
// meridian's capacity on the Mooncake trace at both GPU profiles, and the Azure trace's
// capacity did not change; with three, a key whose first engines are all busy waited
// while a fourth engine idled.
const DefaultFallbacks = 3

// DefaultChoices is the shipped Config.Choices: the least-work choice weighs a key's first
// twelve engines (on the simulator's fleet of three regions of four, all of them), while
// the list Envoy retries down stays at 1+DefaultFallbacks. The choice looks past the first
// four only when it is in play (the key's first engine, or its home, holds SpillFloor or
// more, or the home lies beyond the list), so a light fleet's picks walk as few buckets
// as before. On the simulator (docs/results/README.md), twelve met the SLO for more
// requests near capacity than four on the agentic sessions (by 1 to 1.8 points) and the
// Mooncake trace (by up to 0.6), and within 0.1 of four on the Azure trace; eight gained
// less on the agentic sessions with A100 engines.
const DefaultChoices = 12

// DefaultConfig returns the configuration the sidecar uses unless told otherwise.
func DefaultConfig() Config {
	return Config{
		Buckets:     1 << 18,
		Candidates:  4,
		Fallbacks:   DefaultFallbacks,
		Choices:     DefaultChoices,
		Epsilon:     DefaultEpsilon,
		SpillFloor:  6 * 1024, // the sidecar's spill_floor 6 × decode_work_tokens 1024
		MaxInFlight: 0,
		MaxExamined: 16,
		OverflowAt:  DefaultOverflowAt,
		RoomWait:    DefaultRoomWait,
	}
}

// Validate reports every field that is out of range, naming it.
func (c Config) Validate() error {
	var errs []error
	if c.Buckets < 1<<8 || c.Buckets > 1<<24 || bits.OnesCount(uint(c.Buckets)) != 1 {
		errs = append(errs, fmt.Errorf("picker: buckets is %d: want a power of two in [256, 16777216]", c.Buckets))
	}
	if c.Candidates < 1 || c.Candidates > MaxCandidatesPerBucket {
		errs = append(errs, fmt.Errorf("picker: candidates is %d: want 1..%d", c.Candidates, MaxCandidatesPerBucket))
	}
	if c.Fallbacks < 0 || c.Fallbacks >= MaxExamined {
		errs = append(errs, fmt.Errorf("picker: fallbacks is %d: want 0..%d", c.Fallbacks, MaxExamined-1))
	}
	if c.Choices < c.Fallbacks+1 || c.Choices > MaxExamined {
		errs = append(errs, fmt.Errorf("picker: choices is %d: want %d..%d (at least fallbacks+1)", c.Choices, c.Fallbacks+1, MaxExamined))
	}
	if !(c.Epsilon > 0) || math.IsInf(c.Epsilon, 0) {
		errs = append(errs, fmt.Errorf("picker: epsilon is %v: want a finite value > 0", c.Epsilon))
	}
	if c.SpillFloor < 0 {
		errs = append(errs, fmt.Errorf("picker: spillFloor is %d: want >= 0 (0 disables it)", c.SpillFloor))
	}
	if c.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("picker: maxInFlight is %d: want >= 0 (0 means no cap)", c.MaxInFlight))
	}
	if !(c.OverflowAt >= 0) || c.OverflowAt > MaxOverflowAt {
		errs = append(errs, fmt.Errorf("picker: overflowAt is %v: want 0..%v (0 turns overflow off)", c.OverflowAt, MaxOverflowAt))
	}
	if c.RoomWait < 0 || c.RoomWait > MaxRoomWait {
		errs = append(errs, fmt.Errorf("picker: roomWait is %s: want 0..%s (0 turns it off)", c.RoomWait, MaxRoomWait))
	}
	if c.MaxExamined < max(c.Choices, c.Fallbacks+1) || c.MaxExamined > MaxExamined {
		errs = append(errs, fmt.Errorf("picker: maxExamined is %d: want %d..%d (at least choices)",
			c.MaxExamined, max(c.Choices, c.Fallbacks+1), MaxExamined))
	}
	return errors.Join(errs...)
}

// validateEndpoints checks what NewTable is given, naming the offending entry.
func validateEndpoints(eps []Endpoint) error {
	if len(eps) > MaxEndpoints {
		return fmt.Errorf("picker: %d endpoints: at most %d fit in a table", len(eps), MaxEndpoints)
	}
	seen := make(map[string]int, len(eps))
	for i, ep := range eps {
		switch {
		case ep.Address == "":
			return fmt.Errorf("picker: endpoints[%d] has no address", i)
		case math.IsNaN(ep.Weight) || math.IsInf(ep.Weight, 0) || ep.Weight < 0:
			return fmt.Errorf("picker: endpoints[%d] (%s) has weight %v: want a finite value >= 0", i, ep.Address, ep.Weight)
		case ep.MaxInFlight < 0:
			return fmt.Errorf("picker: endpoints[%d] (%s) has maxInFlight %d: want >= 0", i, ep.Address, ep.MaxInFlight)
		}
		if j, dup := seen[ep.Address]; dup {
			return fmt.Errorf("picker: endpoints[%d] and endpoints[%d] share address %s: merge them first", j, i, ep.Address)
		}
		seen[ep.Address] = i
	}
	return nil
}
