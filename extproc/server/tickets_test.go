package server

import (
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
		tk.put(id, inflight{ticket: tb.Start(0), address: "127.0.0.1:1", start: time.Now()})
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
