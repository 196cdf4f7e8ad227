package load

import (
	"math"
	"slices"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

// SLO bounds what counts as good; a zero field is no bound.
type SLO struct {
	TTFT, E2E time.Duration
}

func (s SLO) met(r Result) bool {
	return (s.TTFT == 0 || r.TTFT <= s.TTFT) && (s.E2E == 0 || r.E2E <= s.E2E)
}

// Summary is the outcome of a run, shaped for one line of JSON. Latency
// percentiles cover ok requests only and are zero when there is no sample;
// ITL percentiles pool every gap of every ok stream.
type Summary struct {
	Requests    int            `json:"requests"`
	OK          int            `json:"ok"`
	Shed        int            `json:"shed"`
	ErrorsTotal int            `json:"errors_total"`
	Errors      map[string]int `json:"errors"` // by status code or class
	TTFTP50     float64        `json:"ttft_p50_ms"`
	TTFTP90     float64        `json:"ttft_p90_ms"`
	TTFTP99     float64        `json:"ttft_p99_ms"`
	ITLP50      float64        `json:"itl_p50_ms"`
	ITLP99      float64        `json:"itl_p99_ms"`
	E2EP50      float64        `json:"e2e_p50_ms"`
	E2EP99      float64        `json:"e2e_p99_ms"`
	// Good counts ok requests within the SLO; GoodputRPS is Good/DurationS.
	Good         int     `json:"good"`
	GoodputRPS   float64 `json:"goodput_rps"`
	OutputTokens int     `json:"output_tokens"`
	DurationS    float64 `json:"duration_s"`
	// Engines counts responses by their x-served-by header.
	Engines map[string]int `json:"engines"`
	// ClientLate counts requests sent more than LateThreshold after their
	// schedule, held by the concurrency cap or a busy client machine: when
	// it is not small, the client shaped the load.
	ClientLate  int  `json:"client_late"`
	Interrupted bool `json:"interrupted"`
}

// LateThreshold is how late a request may leave before it counts in
// Summary.ClientLate; timers on a loaded machine are often a few ms late.
const LateThreshold = 10 * time.Millisecond

func summarize(results []Result, elapsed time.Duration, slo SLO) Summary {
	s := Summary{
		Requests:  len(results),
		Errors:    map[string]int{},
		Engines:   map[string]int{},
		DurationS: round3(elapsed.Seconds()),
	}
	var ttft, itl, e2e []float64
	for _, r := range results {
		if r.Engine != "" {
			s.Engines[r.Engine]++
		}
		if r.Queued > LateThreshold {
			s.ClientLate++
		}
		switch r.Class {
		case ClassOK:
		case ClassShed:
			s.Shed++
			continue
		default:
			s.Errors[r.Class]++
			s.ErrorsTotal++
			continue
		}
		s.OK++
		s.OutputTokens += r.Tokens
		if slo.met(r) {
			s.Good++
		}
		if r.TTFT > 0 {
			ttft = append(ttft, ms(r.TTFT))
		}
		for _, g := range r.ITLs {
			itl = append(itl, ms(g))
		}
		e2e = append(e2e, ms(r.E2E))
	}
	s.TTFTP50, s.TTFTP90, s.TTFTP99 = pct(ttft, 50, 90, 99)
	s.ITLP50, _, s.ITLP99 = pct(itl, 50, 50, 99)
	s.E2EP50, _, s.E2EP99 = pct(e2e, 50, 50, 99)
	if elapsed > 0 {
		s.GoodputRPS = round3(float64(s.Good) / elapsed.Seconds())
	}
	return s
}

func pct(v []float64, a, b, c float64) (float64, float64, float64) {
	slices.Sort(v)
	return round3(trace.Percentile(v, a)), round3(trace.Percentile(v, b)), round3(trace.Percentile(v, c))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// recentTTFT remembers the last recentCap TTFTs with their completion time.
type recentTTFT struct {
	at   [recentCap]time.Time
	ttft [recentCap]time.Duration
	next int
	n    int
}

const recentCap = 2048

func (r *recentTTFT) add(at time.Time, ttft time.Duration) {
	r.at[r.next], r.ttft[r.next] = at, ttft
	r.next = (r.next + 1) % recentCap
	r.n = min(r.n+1, recentCap)
}

// median of the TTFTs recorded at or after since, and how many there were.
func (r *recentTTFT) median(since time.Time) (time.Duration, int) {
	var v []float64
	for i := range r.n {
		if !r.at[i].Before(since) {
			v = append(v, float64(r.ttft[i]))
		}
	}
	slices.Sort(v)
	return time.Duration(trace.Percentile(v, 50)), len(v)
}
