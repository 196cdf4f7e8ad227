package sim

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

// Result is one policy's outcome over one workload. The JSON names are the report's.
type Result struct {
	Policy    string `json:"policy"`
	Scenario  string `json:"scenario"`
	Requests  int    `json:"requests"`
	Completed int    `json:"completed"`
	Shed      int    `json:"shed"`
	// ShedReasons counts Shed by Route.ShedReason ("" when the policy gives none).
	ShedReasons map[string]int `json:"shed_reasons,omitempty"`
	Failed      int            `json:"failed"`
	// ShedRate is Shed / Requests.
	ShedRate float64 `json:"shed_rate"`
	// Latencies in milliseconds, over completed requests, measured at the client.
	TTFTP50 float64 `json:"ttft_p50_ms"`
	TTFTP90 float64 `json:"ttft_p90_ms"`
	TTFTP99 float64 `json:"ttft_p99_ms"`
	ITLP50  float64 `json:"itl_p50_ms"`
	ITLP99  float64 `json:"itl_p99_ms"`
	E2EP99  float64 `json:"e2e_p99_ms"`
	// SLOGoodputRPS counts the requests that met Config.SLO, per second of arrivals.
	SLOGoodputRPS float64 `json:"slo_goodput_rps"`
	// Event is what the requests the scenarios act on saw: those entering through region 0
	// that arrive in the middle third of the run (where step doubles region 0's demand,
	// outage takes its engines down and slow-engine slows its engine 0; in steady, the
	// same slice of undisturbed traffic).
	Event EventResult `json:"event"`
	// KVHitRate is prompt blocks served from cache over all prompt block references;
	// KVHitUpperBound is the same ratio for an infinite cache shared by every engine.
	KVHitRate       float64 `json:"kv_hit_rate"`
	KVHitUpperBound float64 `json:"kv_hit_upper_bound"`
	// WeightChurn is the share of each cluster's traffic its weights moved per minute:
	// half the L1 distance between consecutive one-second samples, summed, averaged over
	// clusters, divided by the run's minutes.
	WeightChurn float64 `json:"weight_churn"`
	// MaxShareStep is the largest share any engine's weight moved between two consecutive
	// one-second samples, in any cluster.
	MaxShareStep float64 `json:"max_share_step"`
	// SteadyWeightChurn and SteadyMaxShareStep are WeightChurn and MaxShareStep in steady
	// state: over the samples after the run's warm-up (warmUp), per minute of the rest of
	// the span.
	SteadyWeightChurn  float64 `json:"steady_weight_churn"`
	SteadyMaxShareStep float64 `json:"steady_max_share_step"`
	// SLOAttainment is the fraction of requests that met Config.SLO (shed and failed ones
	// miss); zero when no SLO was set.
	SLOAttainment float64 `json:"slo_attainment"`
	// Stopped marks a run ended early because its SLO attainment was certain to be below
	// Config.StopBelow: its figures cover what happened until then, and SLOAttainment is
	// an upper bound.
	Stopped bool `json:"stopped,omitempty"`
	// MissedTTFT and MissedITL count requests that missed the SLO on TTFT, and on mean
	// inter-token latency with TTFT met.
	MissedTTFT int `json:"slo_missed_ttft"`
	MissedITL  int `json:"slo_missed_itl"`
	Retries    int `json:"retries"`
	// TooLarge counts requests no engine's KV cache could hold.
	TooLarge int `json:"too_large"`
	// QueuedOnArrival counts the requests completed on an engine that could not admit
	// them when they reached it (engine.Admits: a request waiting ahead, a full batch, or
	// no room for their KV blocks beside the running requests'), so that they waited for
	// running requests to finish; QueuedMissed how many of them missed the SLO.
	QueuedOnArrival int `json:"queued_on_arrival"`
	QueuedMissed    int `json:"queued_on_arrival_missed"`

	// HomeRetention is, for requests whose routing key was seen before, how much of the
	// prompt the key's previous engine still held, by how much that engine had written
	// into its KV cache since (sim/retention.go); empty for a trace without prefixes.
	HomeRetention []RetentionBucket `json:"home_retention,omitempty"`

	// TTFTs are the sorted client TTFTs in seconds, for the CDF plot.
	TTFTs []float64 `json:"-"`
	// Samples are the weights over time, for the weights plot.
	Samples []WeightSample `json:"-"`
}

// EventResult measures the requests a scenario acts on (Result.Event).
type EventResult struct {
	Requests int `json:"requests"`
	// SLOAttainment is the fraction of them that met Config.SLO, and SLOGoodputRPS that
	// many per second of the middle third.
	SLOAttainment float64 `json:"slo_attainment"`
	SLOGoodputRPS float64 `json:"slo_goodput_rps"`
}

// inEvent reports whether r is one of the requests the scenario acts on (Result.Event).
func inEvent(r *Request, span time.Duration) bool {
	return r.Cluster == 0 && r.Arrival >= span/3 && r.Arrival < 2*span/3
}

// WeightSample is every cluster's weights at one instant: W[cluster][engine].
type WeightSample struct {
	At time.Duration
	W  [][]float64
}

// recorder accumulates a run's measurements.
type recorder struct {
	shape             fleetShape
	finished          int
	ttft, e2e         []float64
	itl               logHist
	shed, failed      int
	shedReasons       map[string]int
	hitBlocks, refs   int
	retries, tooLarge int
	queued            int // completed requests their engine could not admit on arrival
	queuedMissed      int // of them, requests that missed the SLO
	samples           []WeightSample
	retention         retention
	slo               SLO
	missed            int // requests known to miss the SLO
	good              int // requests finished that met it
	eventGood         int // of them, requests the scenario acts on (inEvent)
	span              time.Duration
	missedTTFT        int
	missedITL         int
	stopped           bool
}

func newRecorder(f fleetShape, slo SLO, span time.Duration) recorder {
	return recorder{shape: f, itl: newLogHist(), slo: slo, span: span}
}

// miss records that st misses the SLO (once).
func (rc *recorder) miss(st *reqState) {
	if !st.missed {
		st.missed = true
		rc.missed++
	}
}

// certainlyBelow reports whether the SLO attainment of n requests can no longer reach target.
func (rc *recorder) certainlyBelow(target float64, n int) bool {
	return float64(n-rc.missed) < target*float64(n)
}

func (rc *recorder) finish(st *reqState) {
	rc.finished++
	if st.status != completed && rc.slo.set() {
		rc.miss(st)
	}
	if st.status == completed && !st.missed {
		rc.good++
		if inEvent(st.r, rc.span) {
			rc.eventGood++
		}
	}
	rc.refs += len(st.r.Blocks)
	switch st.status {
	case completed:
		if st.queued {
			rc.queued++
			if st.missed {
				rc.queuedMissed++
			}
		}
		rc.ttft = append(rc.ttft, (st.firstToken - st.r.Arrival).Seconds())
		rc.e2e = append(rc.e2e, (st.finish - st.r.Arrival).Seconds())
		rc.hitBlocks += st.hitBlocks
	case shed:
		rc.shed++
		if rc.shedReasons == nil {
			rc.shedReasons = map[string]int{}
		}
		rc.shedReasons[st.route.ShedReason]++
	case failed:
		rc.failed++
	}
}

func (rc *recorder) sample(now time.Duration, p Policy) {
	s := WeightSample{At: now}
	for c := range rc.shape.clusters {
		w := make([]float64, rc.shape.engines)
		p.Weights(c, w)
		s.W = append(s.W, w)
	}
	rc.samples = append(rc.samples, s)
}

// result turns the recorder into a Result; requests never finished count as failed.
func (rc *recorder) result(name string, cfg *Config, w *Workload) Result {
	slices.Sort(rc.ttft)
	slices.Sort(rc.e2e)
	n := len(w.Requests)
	ms := func(sorted []float64, p float64) float64 { return 1000 * trace.Percentile(sorted, p) }
	res := Result{
		Policy: name, Scenario: string(cfg.Scenario), Requests: n, Completed: len(rc.ttft),
		Shed: rc.shed, ShedReasons: rc.shedReasons, Failed: rc.failed + n - rc.finished, ShedRate: float64(rc.shed) / float64(n),
		TTFTP50: ms(rc.ttft, 50), TTFTP90: ms(rc.ttft, 90), TTFTP99: ms(rc.ttft, 99),
		ITLP50: 1000 * rc.itl.quantile(0.50), ITLP99: 1000 * rc.itl.quantile(0.99),
		E2EP99: ms(rc.e2e, 99), KVHitUpperBound: w.UpperBound,
		WeightChurn: churn(rc.samples, w.Span), MaxShareStep: maxShareStep(rc.samples),
		Stopped: rc.stopped, MissedTTFT: rc.missedTTFT, MissedITL: rc.missedITL,
		Retries: rc.retries, TooLarge: rc.tooLarge, QueuedOnArrival: rc.queued, QueuedMissed: rc.queuedMissed,
		TTFTs: rc.ttft, Samples: rc.samples,
	}
	steady, rest := steadySamples(rc.samples, w.Span)
	res.SteadyWeightChurn, res.SteadyMaxShareStep = churn(steady, rest), maxShareStep(steady)
	res.HomeRetention = rc.retention.result()
	if rc.slo.set() && w.Span > 0 {
		res.SLOGoodputRPS = float64(rc.good) / w.Span.Seconds()
		for i := range w.Requests {
			if inEvent(&w.Requests[i], w.Span) {
				res.Event.Requests++
			}
		}
		if res.Event.Requests > 0 {
			res.Event.SLOAttainment = float64(rc.eventGood) / float64(res.Event.Requests)
			res.Event.SLOGoodputRPS = float64(rc.eventGood) / (w.Span / 3).Seconds()
		}
	}
	if rc.slo.set() && n > 0 {
		// Requests never finished (the drain limit) miss too.
		res.SLOAttainment = float64(rc.good) / float64(n)
		if rc.stopped {
			res.SLOAttainment = float64(n-rc.missed) / float64(n)
		}
	}
	if refs := blockRefs(w.Requests); refs > 0 {
		res.KVHitRate = float64(rc.hitBlocks) / float64(refs)
	}
	return res
}

func blockRefs(reqs []Request) int {
	n := 0
	for _, r := range reqs {
		n += len(r.Blocks)
	}
	return n
}

// churn is the mean over clusters of the traffic share moved, per minute of span.
func churn(samples []WeightSample, span time.Duration) float64 {
	if len(samples) < 2 || span <= 0 {
		return 0
	}
	moved := 0.0
	for i := 1; i < len(samples); i++ {
		for c, w := range samples[i].W {
			prev := samples[i-1].W[c]
			d := 0.0
			for e := range w {
				d += math.Abs(w[e] - prev[e])
			}
			moved += d / 2
		}
	}
	clusters := float64(len(samples[0].W))
	return moved / clusters / span.Minutes()
}

// warmUp is how long a run takes to leave its start behind: the control server begins
// with weights by capacity and no demand known, and its slowest estimates (demand's
// longest half-life, signals.Config.MaxDemandHalfLife, and the prefix cache's savings,
// CacheHalfLife) take a minute to weigh what they see. Moves in that time are the plan
// learning the workload, not the steady-state churn issue 14 bounds.
const warmUp = time.Minute

// steadySamples returns the samples at or after the warm-up (warmUp, or half the span
// when that is shorter) and the span they cover.
func steadySamples(samples []WeightSample, span time.Duration) ([]WeightSample, time.Duration) {
	from := min(warmUp, span/2)
	i, _ := slices.BinarySearchFunc(samples, from, func(s WeightSample, t time.Duration) int { return cmp.Compare(s.At, t) })
	return samples[i:], span - from
}

// maxShareStep is the largest move of one engine's share between consecutive samples.
func maxShareStep(samples []WeightSample) float64 {
	step := 0.0
	for i := 1; i < len(samples); i++ {
		for c, w := range samples[i].W {
			prev := samples[i-1].W[c]
			for e := range w {
				step = max(step, math.Abs(w[e]-prev[e]))
			}
		}
	}
	return step
}

// logHist is a histogram with buckets 1% wide on a log scale from 1 µs to about 3 hours,
// for percentiles of values too many to keep.
type logHist struct {
	counts []uint64
	n      uint64
}

const (
	logHistMin   = 1e-6
	logHistRatio = 1.01
	logHistSize  = 2400
)

func newLogHist() logHist { return logHist{counts: make([]uint64, logHistSize)} }

func (h *logHist) observe(v float64) {
	i := 0
	if v > logHistMin {
		i = min(int(math.Log(v/logHistMin)/math.Log(logHistRatio))+1, logHistSize-1)
	}
	h.counts[i]++
	h.n++
}

// quantile returns the geometric middle of the bucket holding quantile q (0..1).
func (h *logHist) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	target := uint64(math.Ceil(q * float64(h.n)))
	var acc uint64
	for i, c := range h.counts {
		acc += c
		if acc >= max(target, 1) {
			if i == 0 {
				return logHistMin
			}
			return logHistMin * math.Pow(logHistRatio, float64(i)-0.5)
		}
	}
	return logHistMin * math.Pow(logHistRatio, logHistSize)
}
