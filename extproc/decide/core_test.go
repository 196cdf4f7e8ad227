package decide

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/guard/guardtest"
	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/picker"
	"github.com/meridian-router/meridian/xdsapi"
)

// newTestCore returns a core on the sidecar's defaults (penalties recover with a 5 s
// half-life, as the sidecar ships), with small tables so that tests can build many, and
// its clock.
func newTestCore(t *testing.T) (*Core, *guardtest.Clock) {
	t.Helper()
	pk := picker.DefaultConfig()
	pk.Buckets = 1 << 10
	oc := guard.DefaultOutlierConfig()
	oc.RecoverHalfLife = 5 * time.Second
	clk := guardtest.NewClock()
	c, err := New(Config{Picker: pk, Outliers: oc, Retry: guard.DefaultRetryConfig(),
		Shed: guard.DefaultShedConfig(), Fallbacks: pk.Fallbacks, DecodeWork: DefaultDecodeWork,
		Log: slog.New(slog.DiscardHandler)}, clk)
	if err != nil {
		t.Fatal(err)
	}
	return c, clk
}

// twoModels is a view of model "a" on engines a0..a3 and model "b" on b0..b3, weight w
// each except where weights says otherwise.
func twoModels(weights map[string]uint32) *xdsapi.View {
	v := &xdsapi.View{Version: "1", Models: map[string]xdsapi.ModelView{}}
	for m, model := range []string{"a", "b"} {
		mv := xdsapi.ModelView{Name: model, Cluster: "model-" + model}
		for i := range 4 {
			name := fmt.Sprintf("%s%d", model, i)
			w := weights[name]
			if w == 0 {
				w = 100
			}
			mv.Endpoints = append(mv.Endpoints, xdsapi.Endpoint{Engine: name, Address: fmt.Sprintf("127.0.0.%d:%d", m+1, 8000+i), Weight: w})
		}
		v.Models[model] = mv
	}
	return v
}

// An engine that fails, then heals, moves its penalty factor at almost every 250 ms
// evaluation for tens of seconds. Each published change rebuilds the tables of the
// models the engine serves, at most once per PublishInterval; the other models keep
// theirs, and every table carries the factors published when it was built.
func TestPenaltyRebuildsAreBoundedAndTouchOnlyTheEnginesModels(t *testing.T) {
	c, clk := newTestCore(t)
	if err := c.Update(twoModels(nil)); err != nil {
		t.Fatal(err)
	}
	tableB := c.routing.Load().models["b"].table
	const (
		every = time.Second            // the shipped guard.OutlierConfig.PublishInterval
		tick  = 250 * time.Millisecond // the sidecar's penalty evaluation interval
	)
	var rebuiltAt []time.Duration
	lowest := 1.0
	for n := range 90 * 4 {
		failing := n >= 10*4 && n < 30*4 // a0 fails every request from 10 s to 30 s
		for range 10 {
			clk.Advance(tick / 10)
			for i := range 4 {
				for _, model := range []string{"a", "b"} {
					status := 200
					if failing && model == "a" && i == 0 {
						status = 503
					}
					c.Outcome(outcome.Record{Upstream: fmt.Sprintf("127.0.0.%d:%d", map[string]int{"a": 1, "b": 2}[model], 8000+i),
						Status: status, TTFT: 50 * time.Millisecond, Attempts: 1})
				}
			}
		}
		_, before := c.TablesBuilt()
		if _, err := c.RefreshPenalties(); err != nil {
			t.Fatal(err)
		}
		_, after := c.TablesBuilt()
		if after == before {
			continue
		}
		at := time.Duration(n+1) * tick
		if after-before != 1 {
			t.Fatalf("at %v: %d tables built for one penalty change on one model's engine, want 1", at, after-before)
		}
		if k := len(rebuiltAt); k > 0 && at-rebuiltAt[k-1] < every {
			t.Fatalf("at %v: tables rebuilt %v after the previous penalty rebuild, want at least %v apart (the rebuild storm)",
				at, at-rebuiltAt[k-1], every)
		}
		rebuiltAt = append(rebuiltAt, at)
		if got := c.routing.Load().models["b"].table; got != tableB {
			t.Fatalf("at %v: model b's table rebuilt, though none of its engines' penalties changed", at)
		}
		f := c.Penalties().Factor("a0")
		lowest = min(lowest, f)
		c.Weights("a", func(engine string, w float64) {
			if engine == "a0" && w != 100*f {
				t.Fatalf("at %v: a0's weight in the table is %v, want 100 × its published factor %v", at, w, f)
			}
		})
	}
	if lowest > 0.1 || c.Penalties().Factor("a0") != 1 {
		t.Fatalf("a0's factor fell to %v and ended at %v: want <= 0.1, then 1", lowest, c.Penalties().Factor("a0"))
	}
	t.Logf("%d penalty rebuilds over a 20 s failure and its recovery, at %v", len(rebuiltAt), rebuiltAt)
}

// An EDS update that changes one model's weights rebuilds that model's table only.
func TestUpdateKeepsTheTablesOfUnchangedModels(t *testing.T) {
	c, _ := newTestCore(t)
	if err := c.Update(twoModels(nil)); err != nil {
		t.Fatal(err)
	}
	first := c.routing.Load()
	if err := c.Update(twoModels(map[string]uint32{"a2": 300})); err != nil {
		t.Fatal(err)
	}
	second := c.routing.Load()
	if second.models["b"].table != first.models["b"].table {
		t.Error("model b's table was rebuilt, though its endpoints did not change")
	}
	if second.models["a"].table == first.models["a"].table {
		t.Error("model a's table was kept, though a2's weight changed")
	}
	if view, pen := c.TablesBuilt(); view != 3 || pen != 0 {
		t.Errorf("tables built: %d for views, %d for penalties; want 3 (two, then one) and 0", view, pen)
	}
	// The kept table ranks every key as a fresh one built from the new view would.
	kept := second.models["b"].table
	var eps []picker.Endpoint
	for _, e := range twoModels(map[string]uint32{"a2": 300}).Models["b"].Endpoints {
		eps = append(eps, picker.Endpoint{Address: e.Address, Engine: e.Engine, Weight: float64(e.Weight)})
	}
	fresh, err := picker.NewTable(c.cfg.Picker, eps, picker.NewLoads())
	if err != nil {
		t.Fatal(err)
	}
	var a, b [picker.MaxExamined]int
	for key := range uint64(4096) {
		key *= 0x9e3779b97f4a7c15
		ra, rb := kept.Pick(key, 1, 0, a[:0]), fresh.Pick(key, 1, 0, b[:0])
		if fmt.Sprint(ra.Order) != fmt.Sprint(rb.Order) {
			t.Fatalf("key %x: kept table picks %v, a fresh one %v", key, ra.Order, rb.Order)
		}
	}
}
