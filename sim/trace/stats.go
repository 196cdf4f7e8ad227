package trace

import (
	"slices"
	"time"
)

// Stats summarises a trace.
type Stats struct {
	Requests int
	// Duration is the span from the first to the last arrival.
	Duration time.Duration
	// MeanRate is (Requests-1)/Duration in requests per second (see MeanRate).
	MeanRate float64
	Input    Dist
	Output   Dist
	// BlockRefs counts hash ids over all requests and UniqueBlocks the
	// distinct ones; both are zero for traces without hash ids.
	BlockRefs, UniqueBlocks int
	// HitRateUpperBound is the fraction of block references that an
	// infinitely large prefix cache shared by every engine would hit:
	// (BlockRefs-UniqueBlocks)/BlockRefs. Because ids are prefix-chained, a
	// block seen before implies its whole prefix was seen before, so this is
	// also the bound for prefix caching. No routing policy can exceed it.
	HitRateUpperBound float64
	// MinuteP90 and MinuteMax are the arrival rate in whole one-minute windows from the
	// first arrival, at the 90th percentile and at the busiest window, as multiples of
	// MeanRate: how far the demand a plan must follow swings for minutes at a time (1 for
	// perfectly even arrivals). Zero for a trace shorter than two minutes.
	MinuteP90, MinuteMax float64
}

// Dist describes a token-count distribution. Percentiles interpolate
// linearly between closest ranks (numpy's default), so they match figures
// computed with numpy.percentile.
type Dist struct {
	Mean          float64
	P50, P90, P99 float64
	Max           int
}

// Summarize computes Stats; reqs must be sorted by arrival.
func Summarize(reqs []Request) Stats {
	s := Stats{Requests: len(reqs), MeanRate: MeanRate(reqs)}
	if len(reqs) == 0 {
		return s
	}
	s.Duration = reqs[len(reqs)-1].Arrival - reqs[0].Arrival
	in := make([]float64, len(reqs))
	out := make([]float64, len(reqs))
	seen := make(map[uint64]struct{})
	for i, r := range reqs {
		in[i], out[i] = float64(r.InputTokens), float64(r.OutputTokens)
		s.BlockRefs += len(r.HashIDs)
		for _, id := range r.HashIDs {
			seen[id] = struct{}{}
		}
	}
	s.Input, s.Output = distOf(in), distOf(out)
	s.MinuteP90, s.MinuteMax = minuteRates(reqs, s.MeanRate)
	s.UniqueBlocks = len(seen)
	if s.BlockRefs > 0 {
		s.HitRateUpperBound = float64(s.BlockRefs-s.UniqueBlocks) / float64(s.BlockRefs)
	}
	return s
}

// minuteRates is Stats.MinuteP90 and MinuteMax.
func minuteRates(reqs []Request, mean float64) (p90, peak float64) {
	span := reqs[len(reqs)-1].Arrival - reqs[0].Arrival
	windows := int(span / time.Minute)
	if windows < 2 || !(mean > 0) {
		return 0, 0
	}
	counts := make([]float64, windows)
	for _, r := range reqs {
		if w := int((r.Arrival - reqs[0].Arrival) / time.Minute); w < windows {
			counts[w]++
		}
	}
	slices.Sort(counts)
	perMinute := mean * 60
	return Percentile(counts, 90) / perMinute, counts[windows-1] / perMinute
}

func distOf(v []float64) Dist {
	slices.Sort(v)
	var sum float64
	for _, x := range v {
		sum += x
	}
	return Dist{
		Mean: sum / float64(len(v)),
		P50:  Percentile(v, 50),
		P90:  Percentile(v, 90),
		P99:  Percentile(v, 99),
		Max:  int(v[len(v)-1]),
	}
}

// Percentile returns the p-th percentile (0..100) of sorted values,
// interpolating linearly between closest ranks; zero for no values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	x := p / 100 * float64(len(sorted)-1)
	if !(x > 0) { // also catches NaN
		return sorted[0]
	}
	lo := int(x)
	if lo >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	return sorted[lo] + (sorted[lo+1]-sorted[lo])*(x-float64(lo))
}
