package decide

import (
	"slices"
	"testing"

	"github.com/meridian-router/meridian/enginemetrics"
	"github.com/meridian-router/meridian/extproc/outcome"
)

// addressOf is the address of the engine named engine in model "a" of twoModels.
func addressOf(t *testing.T, engine string) string {
	t.Helper()
	for _, ep := range twoModels(nil).Models["a"].Endpoints {
		if ep.Engine == engine {
			return ep.Address
		}
	}
	t.Fatalf("no engine %q", engine)
	return ""
}

// What a peer sidecar of the node holds in flight counts in the picks as the core's own
// work does: a key leaves an engine its peers have loaded. The scrape of that engine nets
// the peer's requests out, so they are not counted twice, and counts them again once the
// peer is dropped.
func TestPeersInFlightCountsInPicksAndNetsOutOfTheScrape(t *testing.T) {
	c, _ := newTestCore(t)
	if err := c.Update(twoModels(nil)); err != nil {
		t.Fatal(err)
	}
	req := Request{Model: "a", Key: 42, BodyBytes: 100 * BytesPerToken}
	route := func() Decision {
		t.Helper()
		d := c.Route(req, make([]int, 0, 8))
		if d.Verdict != Steer {
			t.Fatalf("verdict %v", d.Verdict)
		}
		c.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addressOf(t, d.Engine), Status: 200, Attempts: 1})
		return d
	}
	home := route().Engine
	if again := route().Engine; again != home {
		t.Fatalf("an idle fleet moved the key from %s to %s", home, again)
	}
	addr := addressOf(t, home)

	// A peer holds many long prompts on the key's engine.
	c.SetPeerInFlight("10.0.0.2:19082", []EngineInFlight{{Address: addr, Requests: 8, Work: 8 * 50_000}}, 8*50_000)
	if got := c.Peers(); !slices.Equal(got, []string{"10.0.0.2:19082"}) {
		t.Fatalf("peers %v", got)
	}
	moved := route().Engine
	if moved == home {
		t.Errorf("the key stayed on %s, which its peer has loaded with 400k tokens of work", home)
	}
	c.DropPeer("10.0.0.2:19082")
	if len(c.Peers()) != 0 {
		t.Fatalf("peers %v after DropPeer", c.Peers())
	}
	// The key's context is now on the engine it moved to, which stays its home.
	if again := route().Engine; again != moved {
		t.Errorf("with the peer dropped the key went to %s, want its new home %s", again, moved)
	}
	// A dropped peer's requests count only as the scrape shows them.
	c.ObserveEngineLoad(addr, requests(5))
	if got, want := c.ObservedLoad()[home], int64(5*(100+DefaultDecodeWork)); got != want {
		t.Errorf("observed %d with the peer dropped, want all 5 requests at the mean, %d", got, want)
	}

	// The engine's scrape shows the peer's 3 requests and 2 of other routers: only those 2
	// are others' work, at the mean of the core's requests (100 prompt tokens + decode).
	c.SetPeerInFlight("10.0.0.2:19082", []EngineInFlight{{Address: addr, Requests: 3, Work: 3 * 5_000}}, 3*5_000)
	c.ObserveEngineLoad(addr, requests(5))
	if got, want := c.ObservedLoad()[home], int64(2*(100+DefaultDecodeWork)); got != want {
		t.Errorf("observed %d for other routers, want %d: the peer's 3 requests must not count twice", got, want)
	}
	// An engine that states its KV cache: the 25k tokens it holds less the peer's 15k of
	// work are other routers'.
	kv := enginemetrics.Load{Running: 5, KVUsage: 0.25, KVTokens: 100_000}
	c.ObserveEngineLoad(addr, kv)
	if got, want := c.ObservedLoad()[home], int64(25_000-3*5_000); got != want {
		t.Errorf("observed %d from the KV cache, want 25k held - the peer's 15k = %d", got, want)
	}
	// A peer's new snapshot replaces its last.
	c.SetPeerInFlight("10.0.0.2:19082", nil, 0)
	c.ObserveEngineLoad(addr, requests(5))
	if got, want := c.ObservedLoad()[home], int64(5*(100+DefaultDecodeWork)); got != want {
		t.Errorf("observed %d after the peer's requests ended, want %d", got, want)
	}
	c.ObserveEngineLoad(addr, kv)
	if got, want := c.ObservedLoad()[home], int64(25_000); got != want {
		t.Errorf("observed %d from the KV cache after the peer's requests ended, want %d", got, want)
	}
}

// AppendInFlight lists the core's own requests in flight per engine, sorted, with the
// work on engines that hold a share; a finished request leaves it.
func TestAppendInFlightIsTheCoresOwnRequests(t *testing.T) {
	c, _ := newTestCore(t)
	if err := c.Update(twoModels(nil)); err != nil {
		t.Fatal(err)
	}
	var ds []Decision
	for k := range uint64(6) {
		d := c.Route(Request{Model: "a", Key: k << 20, BodyBytes: 400 * BytesPerToken}, make([]int, 0, 8))
		if d.Verdict != Steer {
			t.Fatalf("verdict %v", d.Verdict)
		}
		ds = append(ds, d)
	}
	// A peer's snapshot is not the core's own.
	c.SetPeerInFlight("peer", []EngineInFlight{{Address: addressOf(t, "a0"), Requests: 9, Work: 9000}}, 9000)
	got, ranked := c.AppendInFlight(nil)
	var n, w int64
	for i, e := range got {
		if i > 0 && got[i-1].Address >= e.Address {
			t.Errorf("not sorted by address: %+v", got)
		}
		n += e.Requests
		w += e.Work
	}
	per := int64(400 + DefaultDecodeWork)
	if n != 6 || w != 6*per || ranked != 6*per {
		t.Errorf("snapshot %+v, ranked %d: want 6 requests of %d work, all on ranked engines", got, ranked, per)
	}
	for _, d := range ds {
		c.Outcome(outcome.Record{Ticket: d.Ticket, Upstream: addressOf(t, d.Engine), Status: 200, Attempts: 1})
	}
	if got, ranked := c.AppendInFlight(nil); len(got) != 0 || ranked != 0 {
		t.Errorf("after every request ended: %+v, ranked %d", got, ranked)
	}
}
