package decide

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/meridian-router/meridian/enginemetrics"
	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/guard/guardtest"
	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/picker"
)

// BenchmarkPenaltyEpisode is the CPU the sidecar spends on one engine's penalty episode:
// four engines of one model at the default table size, one failing every request for 20 s
// and then healthy, outcomes at 160 req/s and a penalty evaluation every 250 ms, for 90 s
// of virtual time. One op is the whole episode; tables/op is how many routing tables it
// built, and peak-tables/s the most in any second. publish=0 publishes every factor move
// (the behaviour before guard.OutlierConfig.PublishInterval); 1s is the shipped default.
func BenchmarkPenaltyEpisode(b *testing.B) {
	for _, every := range []time.Duration{0, guard.DefaultOutlierConfig().PublishInterval} {
		b.Run(fmt.Sprintf("publish=%v", every), func(b *testing.B) {
			oc := guard.DefaultOutlierConfig()
			oc.RecoverHalfLife = 5 * time.Second // as the sidecar ships
			oc.PublishInterval = every
			pk := picker.DefaultConfig()
			var tables, peak int64
			for b.Loop() {
				clk := guardtest.NewClock()
				c, err := New(Config{Picker: pk, Outliers: oc, Retry: guard.DefaultRetryConfig(), Shed: guard.DefaultShedConfig(),
					Fallbacks: pk.Fallbacks, DecodeWork: DefaultDecodeWork, Log: slog.New(slog.DiscardHandler)}, clk)
				if err != nil {
					b.Fatal(err)
				}
				v := twoModels(nil)
				delete(v.Models, "b")
				if err := c.Update(v); err != nil {
					b.Fatal(err)
				}
				var second [90]int64
				for n := range 90 * 4 {
					for range 10 {
						clk.Advance(25 * time.Millisecond)
						for i := range 4 {
							status := 200
							if i == 0 && n >= 10*4 && n < 30*4 {
								status = 503
							}
							c.Outcome(outcome.Record{Upstream: fmt.Sprintf("127.0.0.1:%d", 8000+i), Status: status,
								TTFT: 50 * time.Millisecond, Attempts: 1})
						}
					}
					_, before := c.TablesBuilt()
					if _, err := c.RefreshPenalties(); err != nil {
						b.Fatal(err)
					}
					_, after := c.TablesBuilt()
					second[n/4] += after - before
				}
				_, pen := c.TablesBuilt()
				tables = pen
				for _, s := range second {
					peak = max(peak, s)
				}
			}
			b.ReportMetric(float64(tables), "tables/op")
			b.ReportMetric(float64(peak), "peak-tables/s")
		})
	}
}

// BenchmarkObserveEngineLoad is the CPU of one engine's scrape result reaching the core (the
// sidecar's engine_load feed calls it for every engine it scrapes, every 50 ms): eight
// engines with KV-cache figures, each observed in turn with its counters advancing.
func BenchmarkObserveEngineLoad(b *testing.B) {
	c, err := New(Config{Picker: picker.DefaultConfig(), Outliers: guard.DefaultOutlierConfig(), Retry: guard.DefaultRetryConfig(),
		Shed: guard.DefaultShedConfig(), Fallbacks: 2, DecodeWork: DefaultDecodeWork, PrefillWeight: DefaultPrefillWeight,
		Log: slog.New(slog.DiscardHandler)}, guardtest.NewClock())
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Update(twoModels(nil)); err != nil {
		b.Fatal(err)
	}
	addrs := make([]string, 0, 8)
	for _, m := range []int{1, 2} {
		for i := range 4 {
			addrs = append(addrs, fmt.Sprintf("127.0.0.%d:%d", m, 8000+i))
		}
	}
	n := 0.0
	for b.Loop() {
		n++
		for _, addr := range addrs {
			c.ObserveEngineLoad(addr, enginemetrics.Load{Running: 3, Waiting: 1, KVUsage: 0.4, KVTokens: 150_000,
				PrefixQueries: 1000 * n, PrefixHits: 600 * n, GenerationTokens: 50 * n, PromptTokens: 990 * n})
		}
	}
}
