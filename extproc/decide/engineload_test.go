package decide

import (
	"math"
	"testing"

	"github.com/meridian-router/meridian/extproc/outcome"
)

// An engine's scraped queue beyond the core's own requests is other routers' work, at the
// mean work of the core's own requests; a failed scrape (NaN) or a queue no longer than
// the core's own forgets it. The scraped targets are the engines with a share and a URL.
func TestObserveEngineLoadCountsOnlyOthersWork(t *testing.T) {
	c, _ := newTestCore(t)
	v := twoModels(nil)
	mv := v.Models["a"]
	for i := range mv.Endpoints {
		mv.Endpoints[i].MetricsURL = "http://" + mv.Endpoints[i].Address + "/metrics"
	}
	mv.Endpoints[3].Priority = 1 // failover: no share, not scraped
	v.Models["a"] = mv
	if err := c.Update(v); err != nil {
		t.Fatal(err)
	}
	targets := c.LoadTargets(nil)
	if len(targets) != 3 || targets[0].Address != "127.0.0.1:8000" || targets[0].MetricsURL != "http://127.0.0.1:8000/metrics" {
		t.Fatalf("targets %+v: want a0..a2 with their URLs (a3 is failover, model b has no URLs)", targets)
	}

	// Before the core has sent anything, others' requests count as short ones.
	c.ObserveEngineLoad("127.0.0.1:8000", 3)
	if got := c.ObservedLoad()["a0"]; got != 3*DefaultDecodeWork {
		t.Errorf("3 requests observed with none of ours: %d work, want 3 x decode work %d", got, 3*DefaultDecodeWork)
	}

	d := c.Route(Request{Model: "a", Key: 7, BodyBytes: 4000 * BytesPerToken}, make([]int, 0, 8))
	if d.Verdict != Steer {
		t.Fatalf("verdict %v", d.Verdict)
	}
	var addr string
	for _, ep := range v.Models["a"].Endpoints {
		if ep.Engine == d.Engine {
			addr = ep.Address
		}
	}
	ours := int64(4000 + DefaultDecodeWork)
	c.ObserveEngineLoad(addr, 5) // ours and four others
	if got := c.ObservedLoad()[d.Engine]; got != 4*ours {
		t.Errorf("engine holds 5 requests, one of them ours: observed %d, want 4 x our mean work %d", got, 4*ours)
	}
	c.ObserveEngineLoad(addr, 1)
	if got, ok := c.ObservedLoad()[d.Engine]; ok {
		t.Errorf("the engine holds only our request; observed %d for others", got)
	}
	c.ObserveEngineLoad(addr, 6)
	c.ObserveEngineLoad(addr, math.NaN())
	if got, ok := c.ObservedLoad()[d.Engine]; ok {
		t.Errorf("a failed scrape must forget the observation; still %d", got)
	}
	// The mean outlives the core's last request: with none in flight, others still count
	// at it, not at a short request's work.
	c.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addr, Status: 200, Attempts: 1})
	if n := c.InFlightTotal(); n != 0 {
		t.Fatalf("%d in flight after the outcome", n)
	}
	c.ObserveEngineLoad(addr, 2)
	if got := c.ObservedLoad()[d.Engine]; got != 2*ours {
		t.Errorf("after our request ended: observed %d, want 2 x the last mean %d", got, 2*ours)
	}
}
