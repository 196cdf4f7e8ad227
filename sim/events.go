package sim

import (
	"time"

	"github.com/meridian-router/meridian/sim/engine"
)

type eventKind uint8

const (
	evArrival  eventKind = iota // a request reaches its cluster's proxy
	evDeliver                   // an attempt reaches an engine
	evStepEnd                   // an engine step ends
	evFail                      // a failed attempt's error reaches the proxy
	evRefused                   // an attempt's connection was refused (the engine is down): it never started
	evTick                      // policy tick and health scrape
	evSample                    // weights sample
	evScenario                  // a scenario change
	evKV                        // an engine's KV-cache events reach the subscribed routers
	evScrape                    // a policy's own metrics scrape
)

// event is one scheduled happening. Which fields matter depends on kind.
type event struct {
	at     time.Duration
	seq    uint64
	kind   eventKind
	engine int
	gen    uint32 // engine generation, for evStepEnd
	req    *reqState
	action int // index into the scenario's actions
	kv     []engine.KVEvent
}

// eventHeap is a binary min-heap on (at, seq).
type eventHeap struct {
	items []event
	seq   uint64
}

func (h *eventHeap) less(i, j int) bool {
	a, b := &h.items[i], &h.items[j]
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (h *eventHeap) push(e event) {
	h.seq++
	e.seq = h.seq
	h.items = append(h.items, e)
	i := len(h.items) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	top := h.items[0]
	last := len(h.items) - 1
	h.items[0] = h.items[last]
	h.items[last] = event{}
	h.items = h.items[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h.items) && h.less(l, m) {
			m = l
		}
		if r < len(h.items) && h.less(r, m) {
			m = r
		}
		if m == i {
			return top
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
}

func (h *eventHeap) len() int { return len(h.items) }
