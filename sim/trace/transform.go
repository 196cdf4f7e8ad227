package trace

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// First returns the first n requests (all of them when n <= 0 or n exceeds
// the length).
func First(reqs []Request, n int) []Request {
	if n <= 0 || n >= len(reqs) {
		return clone(reqs)
	}
	return clone(reqs[:n])
}

// Window returns the requests with from <= Arrival < to, rebased so that
// from becomes zero. to <= 0 means no upper bound. reqs must be sorted.
func Window(reqs []Request, from, to time.Duration) []Request {
	var out []Request
	for _, r := range reqs {
		if r.Arrival < from || (to > 0 && r.Arrival >= to) {
			continue
		}
		r.Arrival -= from
		out = append(out, r)
	}
	return out
}

// Sample keeps each request independently with probability p, drawing from
// a generator seeded with seed so that the same seed keeps the same requests.
// Arrivals are unchanged, so the rate drops by about p.
func Sample(reqs []Request, p float64, seed uint64) ([]Request, error) {
	if !(p > 0 && p <= 1) {
		return nil, fmt.Errorf("sample probability %v: want 0 < p <= 1", p)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]Request, 0, int(float64(len(reqs))*p)+1)
	for _, r := range reqs {
		if rng.Float64() < p {
			out = append(out, r)
		}
	}
	return out, nil
}

// WithSpeed divides every arrival by speed: speed 2 replays the trace twice
// as fast (twice the request rate).
func WithSpeed(reqs []Request, speed float64) ([]Request, error) {
	if !(speed > 0) || math.IsInf(speed, 0) {
		return nil, fmt.Errorf("speed %v: want a finite number > 0", speed)
	}
	out := clone(reqs)
	for i := range out {
		at := math.Round(float64(out[i].Arrival) / speed)
		if math.Abs(at) >= math.MaxInt64 {
			return nil, fmt.Errorf("speed %v: arrival %v would overflow", speed, out[i].Arrival)
		}
		out[i].Arrival = time.Duration(at)
	}
	return out, nil
}

// WithArrivalsOf gives reqs, in their order, the arrival times of times (sorted), from 0:
// request i arrives when times[i] did, relative to times[0]. Past the end of times its
// arrivals repeat, each round after the last one's span plus its mean gap. It puts one
// trace's requests (their sizes and prefixes) on another's arrival process, for example
// a synthetic trace's Poisson arrivals replaced by a production trace's bursts.
func WithArrivalsOf(reqs, times []Request) ([]Request, error) {
	if len(times) < 2 || MeanRate(times) == 0 {
		return nil, fmt.Errorf("take arrivals from %d requests: %w", len(times), ErrNoSpan)
	}
	span := times[len(times)-1].Arrival - times[0].Arrival
	round := span + time.Duration(float64(span)/float64(len(times)-1))
	out := clone(reqs)
	for i := range out {
		out[i].Arrival = time.Duration(i/len(times))*round + times[i%len(times)].Arrival - times[0].Arrival
	}
	return out, nil
}

// ErrNoSpan is returned (wrapped) when a trace's arrivals span no time, so
// that its rate is undefined.
var ErrNoSpan = errors.New("arrivals span no time")

// WithRate rescales arrivals so that MeanRate of the result equals rps
// (requests per second). To offer a load F times a fleet's capacity C (in
// requests/s), pass F*C. reqs must be sorted.
func WithRate(reqs []Request, rps float64) ([]Request, error) {
	if !(rps > 0) || math.IsInf(rps, 0) {
		return nil, fmt.Errorf("target rate %v req/s: want a finite number > 0", rps)
	}
	cur := MeanRate(reqs)
	if cur == 0 {
		return nil, fmt.Errorf("rescale %d requests: %w", len(reqs), ErrNoSpan)
	}
	return WithSpeed(reqs, rps/cur)
}

// MeanRate is the inverse of the mean gap between arrivals, (n-1)/span, in
// requests per second; zero when there are fewer than two requests or they
// all arrive at once. reqs must be sorted.
func MeanRate(reqs []Request) float64 {
	if len(reqs) < 2 {
		return 0
	}
	span := reqs[len(reqs)-1].Arrival - reqs[0].Arrival
	if span <= 0 {
		return 0
	}
	return float64(len(reqs)-1) / span.Seconds()
}

func clone(reqs []Request) []Request {
	return append([]Request(nil), reqs...)
}
