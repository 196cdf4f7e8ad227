package solver

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
)

// loopFleet is a simulated fleet for closed-loop tests: two regions with two
// engines each and one cluster per region. Engine latency follows the Curve
// model and explodes at capacity; what a controller observes is the RTT plus
// that latency, with a little measurement noise.
type loopFleet struct {
	clusters []string
	engines  []Engine
	rtt      [][]float64
	rng      *rand.Rand
}

func newLoopFleet(seed uint64) *loopFleet {
	curve := Curve{Base: 0.1, Queue: 0.05}
	f := &loopFleet{clusters: []string{"east", "west"}, rng: rand.New(rand.NewPCG(seed, 1))}
	for _, name := range []string{"east-1", "east-2", "west-1", "west-2"} {
		f.engines = append(f.engines, Engine{Name: name, Models: []int{0}, Capacity: 100, Healthy: true, Curve: curve})
	}
	f.rtt = [][]float64{{0.001, 0.002, 0.040, 0.041}, {0.040, 0.041, 0.001, 0.002}}
	return f
}

// loads returns each engine's arrival rate when cluster c sends demand[c]
// split by shares[c] (each row sums to 1).
func (f *loopFleet) loads(demand []float64, shares [][]float64) []float64 {
	load := make([]float64, len(f.engines))
	for c := range shares {
		for e, s := range shares[c] {
			load[e] += demand[c] * s
		}
	}
	return load
}

// observe is the latency cluster c sees from engine e: RTT plus the engine's
// latency at its load (capped: a saturated engine times out at 10 s), ±2 %.
func (f *loopFleet) observe(c, e int, load float64) float64 {
	eng := f.engines[e]
	l := math.Min(10, eng.Curve.Latency(load, eng.Capacity))
	return (f.rtt[c][e] + l) * (1 + 0.02*(2*f.rng.Float64()-1))
}

// demandAt is the offered load: east steps from 60 to 200 req/s at step 10,
// more than its own region serves well.
func demandAt(t int) []float64 {
	if t < 10 {
		return []float64{60, 60}
	}
	return []float64{200, 60}
}

const loopSteps = 60

// totalVariation sums |Δshare| over clusters, engines and steps from first.
func totalVariation(history [][][]float64, first int) float64 {
	tv := 0.0
	for t := max(first, 1); t < len(history); t++ {
		for c := range history[t] {
			for e := range history[t][c] {
				tv += math.Abs(history[t][c][e] - history[t-1][c][e])
			}
		}
	}
	return tv
}

// runOptimizer closes the loop through Solve: each period it plans from the
// measured demand (±2 % noise) with the previous plan as Prev, and the data
// plane splits traffic by the quantized weights.
func runOptimizer(t *testing.T, f *loopFleet, params Params) [][][]float64 {
	var prev *Solution
	var history [][][]float64
	for step := range loopSteps {
		demand := demandAt(step)
		measured := make([][]float64, len(demand))
		for c, d := range demand {
			measured[c] = []float64{d * (1 + 0.02*(2*f.rng.Float64()-1))}
		}
		p := &Problem{Clusters: f.clusters, Models: []string{"m"}, Engines: f.engines,
			Demand: measured, RTT: f.rtt, Prev: prev, Params: params}
		sol, err := Solve(context.Background(), p)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		prev = sol
		shares := make([][]float64, len(f.clusters))
		for c := range shares {
			shares[c] = normalize(sol.Weights(c, 0, 1000))
		}
		history = append(history, shares)
	}
	return history
}

// runProportional is the old design: every period each cluster multiplies
// the weight of an engine by 1 + gain·(avg − latency)/avg, where latency is
// the engine's smoothed observed latency and avg their weighted mean, so
// traffic drifts toward engines that look faster than average.
func runProportional(f *loopFleet, gain, alpha float64) [][][]float64 {
	nc, ne := len(f.clusters), len(f.engines)
	shares := make([][]float64, nc)
	smooth := make([][]float64, nc)
	for c := range shares {
		shares[c] = make([]float64, ne)
		smooth[c] = make([]float64, ne)
		for e := range shares[c] {
			shares[c][e] = 1 / float64(ne)
		}
	}
	var history [][][]float64
	for step := range loopSteps {
		load := f.loads(demandAt(step), shares)
		next := make([][]float64, nc)
		for c := range shares {
			avg := 0.0
			for e := range shares[c] {
				obs := f.observe(c, e, load[e])
				if step == 0 {
					smooth[c][e] = obs
				}
				smooth[c][e] += alpha * (obs - smooth[c][e])
				avg += shares[c][e] * smooth[c][e]
			}
			next[c] = make([]float64, ne)
			for e := range shares[c] {
				next[c][e] = math.Max(1e-3, shares[c][e]*(1+gain*(avg-smooth[c][e])/avg))
			}
			next[c] = normalize(next[c])
		}
		history = append(history, shares)
		shares = next
	}
	return history
}

func normalize[T uint32 | float64](w []T) []float64 {
	sum := 0.0
	for _, x := range w {
		sum += float64(x)
	}
	out := make([]float64, len(w))
	for i, x := range w {
		out[i] = float64(x) / sum
	}
	return out
}

// TestClosedLoopSettles: after a step in demand the optimizer moves once and
// then holds, while proportional controllers (two tunings: a fast one, and a
// gentle one on heavily smoothed signals) keep swinging traffic. The settle
// window starts 5 periods after the step.
func TestClosedLoopSettles(t *testing.T) {
	const settleFrom = 15
	for seed := uint64(1); seed <= 3; seed++ {
		opt := runOptimizer(t, newLoopFleet(seed), DefaultParams())
		optTV := totalVariation(opt, settleFrom)
		if stepTV := totalVariation(opt[:settleFrom], 10); stepTV < 0.1 {
			t.Fatalf("seed %d: optimizer moved only %.4f after the step: it should shift east's excess west", seed, stepTV)
		}
		if optTV > 0.05 {
			t.Errorf("seed %d: optimizer weights still moving after settling: total variation %.4f", seed, optTV)
		}
		last := opt[len(opt)-1][0]
		if west := last[2] + last[3]; west < 0.05 {
			t.Errorf("seed %d: east sends %.3f of its traffic west; its own engines cannot take 200 req/s well", seed, west)
		}
		for _, b := range []struct{ gain, alpha float64 }{{1.5, 0.5}, {0.8, 0.2}} {
			base := runProportional(newLoopFleet(seed), b.gain, b.alpha)
			baseTV := totalVariation(base, settleFrom)
			t.Logf("seed %d: weight total variation from period %d: optimizer %.4f, proportional (gain %.1f, α %.1f) %.4f",
				seed, settleFrom, optTV, b.gain, b.alpha, baseTV)
			if baseTV < 1 || baseTV < 20*optTV {
				t.Errorf("seed %d: proportional (gain %.1f, α %.1f) total variation %.4f: expected it to oscillate (≥ 1 and ≥ 20× the optimizer's %.4f)",
					seed, b.gain, b.alpha, baseTV, optTV)
			}
		}
	}
}
