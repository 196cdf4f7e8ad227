package load

import (
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

// Hash-id namespaces for synthetic requests, so group prefixes and
// per-request blocks can never collide.
const (
	groupIDBase  = 1 << 62
	uniqueIDBase = 1 << 63
)

// OpenLoop describes arrivals at a fixed mean rate, independent of how fast
// the server answers.
type OpenLoop struct {
	// Rate is the mean request rate in requests per second.
	Rate float64
	// Uniform spaces arrivals exactly 1/Rate apart; otherwise gaps are
	// exponential (a Poisson process).
	Uniform bool
	// Duration and Count bound the schedule; at least one must be set.
	Duration time.Duration
	Count    int
	// Seed makes Poisson gaps and prefix-group choices reproducible.
	Seed uint64
	// PromptTokens and OutputTokens size every request.
	PromptTokens, OutputTokens int
	// PrefixGroups > 0 makes each request start with the shared prefix of
	// one of that many groups (chosen uniformly), PrefixBlocks blocks of
	// trace.BlockTokens tokens long; the rest of its prompt is its own.
	PrefixGroups, PrefixBlocks int
}

// Validate reports every bad field.
func (o OpenLoop) Validate() error {
	switch {
	case !(o.Rate > 0) || math.IsInf(o.Rate, 0):
		return fmt.Errorf("open loop: rate %v req/s: want a finite number > 0", o.Rate)
	case o.Duration <= 0 && o.Count <= 0:
		return fmt.Errorf("open loop: set a duration or a count so the run is bounded")
	case o.Duration < 0 || o.Count < 0:
		return fmt.Errorf("open loop: duration %v and count %d must not be negative", o.Duration, o.Count)
	case o.PromptTokens < 1 || o.OutputTokens < 1:
		return fmt.Errorf("open loop: prompt tokens %d and output tokens %d must be >= 1", o.PromptTokens, o.OutputTokens)
	case o.PrefixGroups < 0 || o.PrefixBlocks < 0:
		return fmt.Errorf("open loop: prefix groups %d and blocks %d must not be negative", o.PrefixGroups, o.PrefixBlocks)
	}
	return nil
}

// Requests yields the schedule. Call Validate first: an invalid OpenLoop
// yields nothing.
func (o OpenLoop) Requests() iter.Seq[trace.Request] {
	return func(yield func(trace.Request) bool) {
		if o.Validate() != nil {
			return
		}
		rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x5851f42d4c957f2d))
		blocks := max(1, (o.PromptTokens+trace.BlockTokens-1)/trace.BlockTokens)
		var at time.Duration
		for i := 0; o.Count <= 0 || i < o.Count; i++ {
			if i > 0 {
				at += o.gap(rng)
			}
			if o.Duration > 0 && at >= o.Duration {
				return
			}
			r := trace.Request{Arrival: at, InputTokens: o.PromptTokens, OutputTokens: o.OutputTokens}
			if o.PrefixGroups > 0 {
				r.HashIDs = o.hashIDs(rng.IntN(o.PrefixGroups), i, blocks)
			}
			if !yield(r) {
				return
			}
		}
	}
}

func (o OpenLoop) gap(rng *rand.Rand) time.Duration {
	mean := float64(time.Second) / o.Rate
	if o.Uniform {
		return time.Duration(mean)
	}
	return time.Duration(rng.ExpFloat64() * mean)
}

// hashIDs gives request i of group g the group's prefix then its own blocks.
func (o OpenLoop) hashIDs(g, i, blocks int) []uint64 {
	ids := make([]uint64, max(blocks, o.PrefixBlocks))
	for j := range ids {
		if j < o.PrefixBlocks {
			ids[j] = groupIDBase + uint64(g)*uint64(o.PrefixBlocks) + uint64(j)
		} else {
			ids[j] = uniqueIDBase + uint64(i)*uint64(len(ids)) + uint64(j)
		}
	}
	return ids
}
