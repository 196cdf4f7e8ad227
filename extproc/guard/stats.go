package guard

import (
	"math"
	"math/bits"
	"time"
)

// Latency histograms use log-spaced buckets: four per octave (each about 19% wide)
// above latencyUnit, so a quantile read from them is within about ±10%.
const (
	latencyUnit    = 100 * time.Microsecond
	latencyBuckets = 88 // up to 100µs × 2^22 ≈ 7 minutes; longer lands in the last
)

// latencyBucket maps d to its histogram bucket.
func latencyBucket(d time.Duration) int {
	u := uint64(max(d, 0) / latencyUnit)
	if u < 4 {
		return int(u)
	}
	e := bits.Len64(u) - 1 // u in [2^e, 2^(e+1)), e ≥ 2
	m := int(u>>(e-2)) & 3 // which quarter of the octave
	return min(4*(e-1)+m, latencyBuckets-1)
}

// bucketBounds returns the range of durations bucket i holds.
func bucketBounds(i int) (lo, hi time.Duration) {
	if i < 4 {
		return time.Duration(i) * latencyUnit, time.Duration(i+1) * latencyUnit
	}
	e, m := i/4+1, i%4
	lo = time.Duration(uint64(4+m)<<(e-2)) * latencyUnit
	hi = time.Duration(uint64(5+m)<<(e-2)) * latencyUnit
	return lo, hi
}

// engineStats are one engine's recent outcomes, every count exponentially decayed
// with the configured half-life, so old behaviour fades without a ring of windows.
type engineStats struct {
	requests float64
	errors   float64
	ttft     [latencyBuckets]float64
	ttftN    float64
	itlSum   float64 // seconds
	itlN     float64
}

func (s *engineStats) add(o Outcome) {
	s.requests++
	if !o.OK {
		s.errors++
	}
	if o.TTFT > 0 {
		s.ttft[latencyBucket(o.TTFT)]++
		s.ttftN++
	}
	if o.ITL > 0 {
		s.itlSum += o.ITL.Seconds()
		s.itlN++
	}
}

func (s *engineStats) decay(f float64) {
	s.requests *= f
	s.errors *= f
	s.ttftN *= f
	s.itlSum *= f
	s.itlN *= f
	for i := range s.ttft {
		s.ttft[i] *= f
	}
}

func (s *engineStats) errorRate() float64 {
	if s.requests == 0 {
		return 0
	}
	return s.errors / s.requests
}

func (s *engineStats) itlMean() time.Duration {
	if s.itlN == 0 {
		return 0
	}
	return time.Duration(s.itlSum / s.itlN * float64(time.Second))
}

// ttftQuantile reads quantile q in (0, 1) from the histogram, interpolating
// geometrically inside the bucket it falls in. It returns 0 with no samples.
func (s *engineStats) ttftQuantile(q float64) time.Duration {
	if s.ttftN == 0 {
		return 0
	}
	target, cum := q*s.ttftN, 0.0
	for i, c := range s.ttft {
		if c == 0 || cum+c < target {
			cum += c
			continue
		}
		lo, hi := bucketBounds(i)
		frac := (target - cum) / c
		if lo == 0 {
			return lo + time.Duration(frac*float64(hi-lo))
		}
		return time.Duration(float64(lo) * math.Pow(float64(hi)/float64(lo), frac))
	}
	_, hi := bucketBounds(latencyBuckets - 1)
	return hi
}
