package decide

import (
	"fmt"
	"testing"
	"time"

	"github.com/meridian-router/meridian/extproc/picker"
)

// Every ticket is released exactly once, whichever of stream end, outcome and expiry comes
// first.
func TestTicketsReleaseOnce(t *testing.T) {
	loads := picker.NewLoads()
	tb, err := picker.NewTable(picker.DefaultConfig(), []picker.Endpoint{{Address: "127.0.0.1:1", Weight: 1}}, loads)
	if err != nil {
		t.Fatal(err)
	}
	tk := newTickets()
	start := func() string {
		id := tk.next()
		tk.put(id, inflight{ticket: tb.Start(0, 1), address: "127.0.0.1:1", start: time.Now()})
		return id
	}
	a, b, c, d := start(), start(), start(), start()
	if got := loads.Total(); got != 4 {
		t.Fatalf("in flight %d, want 4", got)
	}
	tk.end(a) // stream ended first
	tk.end(a)
	if _, ok := tk.take(a); !ok || loads.Total() != 3 {
		t.Fatalf("after end+end+take of a: in flight %d, want 3", loads.Total())
	}
	tk.take(b) // outcome first
	tk.end(b)
	if loads.Total() != 2 {
		t.Fatalf("after take+end of b: in flight %d, want 2", loads.Total())
	}
	tk.end(c) // ended, outcome lost: expiry must not release again
	if n := tk.expire(time.Now().Add(time.Second)); n != 1 || loads.Total() != 0 {
		t.Fatalf("expire released %d (want d only), in flight %d", n, loads.Total())
	}
	if _, ok := tk.take(d); ok || tk.len() != 0 {
		t.Fatal("expired tickets are still tracked")
	}
	_ = c
}

// An outcome that matched no ticket is remembered by request id: a stalled sidecar that
// routes the request afterwards (Envoy gave up on it and served it) does not count it.
func TestTicketsOutcomeBeforeRoute(t *testing.T) {
	loads := picker.NewLoads()
	tb, err := picker.NewTable(picker.DefaultConfig(), []picker.Endpoint{{Address: "127.0.0.1:1", Weight: 1}}, loads)
	if err != nil {
		t.Fatal(err)
	}
	tk := newTickets()
	tk.finish("late")
	if tk.put(tk.next(), inflight{ticket: tb.Start(0, 1), requestID: "late", start: time.Now()}) || loads.Total() != 0 {
		t.Fatalf("a request whose outcome came first is tracked (in flight %d)", loads.Total())
	}
	id := tk.next()
	if !tk.put(id, inflight{ticket: tb.Start(0, 1), requestID: "late", start: time.Now()}) {
		t.Fatal("the request id is remembered once only: a new request with it must be tracked")
	}
	if _, ok := tk.takeRequest("late"); !ok || loads.Total() != 0 {
		t.Fatalf("outcome by request id: in flight %d, want 0", loads.Total())
	}
	for i := range 2 * finishedKept { // the memory is bounded: the oldest id is forgotten
		tk.finish(fmt.Sprint("r", i))
	}
	if n := tk.finishedLen(); n != finishedKept {
		t.Fatalf("%d finished ids kept, want %d", n, finishedKept)
	}
	if !tk.put(tk.next(), inflight{ticket: tb.Start(0, 1), requestID: "r0", start: time.Now()}) {
		t.Fatal("the oldest finished id should have been forgotten")
	}
}
