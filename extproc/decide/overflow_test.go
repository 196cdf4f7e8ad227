package decide

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/meridian-router/meridian/enginemetrics"
	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/guard/guardtest"
	"github.com/meridian-router/meridian/extproc/picker"
	"github.com/meridian-router/meridian/xdsapi"
)

// overflowView is model "a" with a share of a0 and a1 (local) and failover engines a2 (80
// ms away), a3 (20 ms) and a4 (40 ms), every one with a metrics URL.
func overflowView() *xdsapi.View {
	mv := xdsapi.ModelView{Name: "a", Cluster: "model-a"}
	for i, rtt := range []float64{1, 1, 80, 20, 40} {
		ep := xdsapi.Endpoint{Engine: fmt.Sprintf("a%d", i), Address: fmt.Sprintf("127.0.0.1:%d", 8000+i), Weight: 100, RTTMillis: rtt}
		ep.MetricsURL = "http://" + ep.Address + "/metrics"
		if i >= 2 {
			ep.Weight, ep.Priority = 1, 1
		}
		mv.Endpoints = append(mv.Endpoints, ep)
	}
	return &xdsapi.View{Version: "1", Models: map[string]xdsapi.ModelView{"a": mv}}
}

func overflowCore(t *testing.T, engines int) *Core {
	t.Helper()
	return overflowViewCore(t, func(c *Config) { c.OverflowEngines = engines })
}

// overflowViewCore is a core with the shipped decision settings, as set changes them,
// routing overflowView.
func overflowViewCore(t *testing.T, set func(*Config)) *Core {
	t.Helper()
	pk := picker.DefaultConfig()
	pk.Buckets = 1 << 10
	cfg := Config{Picker: pk, Outliers: guard.DefaultOutlierConfig(), Retry: guard.DefaultRetryConfig(),
		Shed: guard.DefaultShedConfig(), Fallbacks: pk.Fallbacks, DecodeWork: DefaultDecodeWork,
		MoveFactor: DefaultMoveFactor, Log: slog.New(slog.DiscardHandler)}
	set(&cfg)
	c, err := New(cfg, guardtest.NewClock())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Update(overflowView()); err != nil {
		t.Fatal(err)
	}
	return c
}

// The nearest failover engines are scraped and, when both engines with a share would queue
// a request, the emptiest of them takes it; the endpoint list names it once, first.
func TestOverflowSendsWhatLocalEnginesWouldQueue(t *testing.T) {
	c := overflowCore(t, 2)
	var got []string
	for _, tg := range c.LoadTargets(nil) {
		got = append(got, tg.Address)
	}
	// a0, a1 (a share), a3 and a4 (the two nearest failover engines); not a2.
	if want := []string{"127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8003", "127.0.0.1:8004"}; !slices.Equal(got, want) {
		t.Fatalf("scraped %v, want %v", got, want)
	}
	busy := enginemetrics.Load{Running: 8, Waiting: 4, KVUsage: 0.9, KVTokens: 100_000}
	idle := enginemetrics.Load{KVUsage: 0, KVTokens: 100_000}
	for _, a := range got {
		c.ObserveEngineLoad(a, idle)
	}
	req := Request{Model: "a", Key: 42, BodyBytes: 3000 * BytesPerToken}
	if d := c.Route(req, make([]int, 0, 8)); d.Overflowed || (d.Engine != "a0" && d.Engine != "a1") {
		t.Fatalf("idle fleet: primary %s overflowed %v, want a0 or a1", d.Engine, d.Overflowed)
	}
	c.ObserveEngineLoad("127.0.0.1:8000", busy)
	c.ObserveEngineLoad("127.0.0.1:8001", busy)
	c.ObserveEngineLoad("127.0.0.1:8003", enginemetrics.Load{KVUsage: 0.05, KVTokens: 100_000})
	d := c.Route(Request{Model: "a", Key: 43, BodyBytes: 3000 * BytesPerToken}, make([]int, 0, 8))
	if d.Verdict != Steer || !d.Overflowed || d.Engine != "a4" {
		t.Fatalf("a0 and a1 holding 90%% of their caches: primary %s overflowed %v, want a4 (a3 holds 5,000 tokens)", d.Engine, d.Overflowed)
	}
	dest := string(d.AppendDestination(nil))
	engines := d.AppendEngines(nil)
	if strings.Count(dest, "127.0.0.1:8004") != 1 || !strings.HasPrefix(dest, "127.0.0.1:8004,") || len(engines) != 1+picker.DefaultFallbacks {
		t.Errorf("destination %q (engines %v): want a4 first and once, %d engines in all", dest, engines, 1+picker.DefaultFallbacks)
	}
	// The ticket counts the request on a4 until its outcome.
	if n := c.InFlight()["a4"]; n != 1 {
		t.Errorf("a4 in flight %d, want 1", n)
	}
	// With no overflow engines configured, the same state keeps the request local.
	c0 := overflowCore(t, 0)
	for _, tg := range c.LoadTargets(nil) {
		c0.ObserveEngineLoad(tg.Address, busy)
	}
	if n := len(c0.LoadTargets(nil)); n != 2 {
		t.Errorf("overflow_engines 0: %d engines scraped, want the 2 with a share", n)
	}
	if d := c0.Route(req, make([]int, 0, 8)); d.Overflowed {
		t.Errorf("overflow_engines 0: overflowed to %s", d.Engine)
	}
}

// An overflow engine whose scrape failed takes no overflow (it would look empty); a
// subset hint keeps Overflowed true only when the engine it leaves first is an overflow
// one, and never reaches an overflow engine but through the gate.
func TestOverflowGuards(t *testing.T) {
	c := overflowCore(t, 2)
	busy := enginemetrics.Load{Running: 8, Waiting: 4, KVUsage: 0.9, KVTokens: 100_000}
	idle := enginemetrics.Load{KVUsage: 0, KVTokens: 100_000}
	c.ObserveEngineLoad("127.0.0.1:8000", busy)
	c.ObserveEngineLoad("127.0.0.1:8001", busy)
	c.ObserveEngineLoad("127.0.0.1:8003", idle)
	c.ObserveEngineLoad("127.0.0.1:8004", idle)
	req := Request{Model: "a", Key: 44, BodyBytes: 3000 * BytesPerToken}
	c.ForgetEngineLoad("127.0.0.1:8003")
	c.ForgetEngineLoad("127.0.0.1:8004")
	if d := c.Route(req, make([]int, 0, 8)); d.Overflowed {
		t.Errorf("overflow engines whose scrapes failed: overflowed to %s", d.Engine)
	}
	c.ObserveEngineLoad("127.0.0.1:8003", idle)
	c.ObserveEngineLoad("127.0.0.1:8004", idle)

	sub := req
	sub.Key, sub.HasSubset, sub.Subset = 45, true, []string{"127.0.0.1:8000"}
	if d := c.Route(sub, make([]int, 0, 8)); d.Verdict != Steer || d.Overflowed || d.Engine != "a0" {
		t.Errorf("subset {a0}, an overflowing pick: engine %s overflowed %v, want a0 and not overflowed", d.Engine, d.Overflowed)
	}
	c2 := overflowCore(t, 2) // idle: no overflow, and a subset of only a failover engine is not routable
	sub.Subset = []string{"127.0.0.1:8003"}
	if d := c2.Route(sub, make([]int, 0, 8)); d.Verdict != NoEngine {
		t.Errorf("subset {a3} with idle local engines: verdict %v engine %s, want no_engine (overflow only through its gate)", d.Verdict, d.Engine)
	}
}
