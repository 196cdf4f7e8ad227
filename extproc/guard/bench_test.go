package guard

import (
	"fmt"
	"testing"
	"time"

	"github.com/meridian-router/meridian/extproc/guard/guardtest"
)

// The per-request guard calls: Shedder.Decide and Retries.Allow run on every request,
// Outliers.Observe on every outcome. They read a fake clock that moves 1 ms per call,
// so the numbers are the guards' own cost: a time.Now() comes on top (see
// BenchmarkSystemClock; on some VMs it is the larger part).

func BenchmarkSystemClock(b *testing.B) {
	var c Clock = SystemClock{}
	for b.Loop() {
		c.Now()
	}
}

func BenchmarkShedDecide(b *testing.B) {
	for _, f := range []float64{0, 0.3} {
		b.Run(fmt.Sprintf("fraction=%v", f), func(b *testing.B) {
			clk := guardtest.NewClock()
			s, err := NewShedder(DefaultShedConfig(), clk)
			if err != nil {
				b.Fatal(err)
			}
			_ = s.SetFractions(map[string]float64{"m": f})
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				clk.Advance(time.Millisecond)
				s.Decide("m", i&3, false, true, float64(1000+(i&7)*500))
				i++
			}
		})
	}
}

func BenchmarkRetriesAllow(b *testing.B) {
	r, err := NewRetries(DefaultRetryConfig())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		r.Allow(0.6)
	}
}

func BenchmarkOutliersObserve(b *testing.B) {
	clk := guardtest.NewClock()
	o, err := NewOutliers(DefaultOutlierConfig(), clk)
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, 64)
	for i := range names {
		names[i] = fmt.Sprintf("engine-%d", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		clk.Advance(time.Millisecond)
		o.Observe(Outcome{Engine: names[i&63], OK: true, TTFT: 150 * time.Millisecond, ITL: 20 * time.Millisecond})
		i++
	}
}

// BenchmarkOutliersEvaluate is the periodic cost (once a second) at fleet sizes.
func BenchmarkOutliersEvaluate(b *testing.B) {
	for _, n := range []int{16, 256, 4096} {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			clk := guardtest.NewClock()
			cfg := DefaultOutlierConfig()
			cfg.StatsHalfLife = 1000 * time.Hour // keep the fleet's statistics alive
			o, err := NewOutliers(cfg, clk)
			if err != nil {
				b.Fatal(err)
			}
			for i := range n * 30 {
				o.Observe(Outcome{Engine: fmt.Sprintf("engine-%d", i%n), OK: i%50 != 0,
					TTFT: time.Duration(100+i%200) * time.Millisecond, ITL: 20 * time.Millisecond})
			}
			b.ReportAllocs()
			for b.Loop() {
				clk.Advance(time.Second)
				o.Evaluate()
			}
		})
	}
}
