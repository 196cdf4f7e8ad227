package picker

import (
	"fmt"
	"math"
	"testing"
)

var benchSizes = []int{16, 256, 4096}

// loadedTable is a default-config table whose endpoints carry about two requests in
// flight each, placed by Pick itself, so the bounded-load checks see realistic counts.
func loadedTable(b *testing.B, n int) *Table {
	b.Helper()
	tb := mustTable(b, DefaultConfig(), fleet(n, skewed), NewLoads())
	var dst []int
	for _, k := range keys(2*n, 17) {
		r := tb.Pick(k, 1, 1, dst)
		dst = r.Order
		tb.Start(r.Order[0], 1)
	}
	return tb
}

// benchRequests runs request(tb, key, dst) over fresh keys at every benchmark size.
func benchRequests(b *testing.B, request func(tb *Table, key uint64, dst []int) []int) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			tb := loadedTable(b, n)
			ks := keys(1<<14, 19)
			dst := make([]int, 0, tb.cfg.Choices)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				dst = request(tb, ks[i&(len(ks)-1)], dst)
				i++
			}
		})
	}
}

// BenchmarkPick is the per-request hot path: one Pick of a fresh key.
func BenchmarkPick(b *testing.B) {
	benchRequests(b, func(tb *Table, key uint64, dst []int) []int { return tb.Pick(key, 1, 1, dst).Order })
}

// BenchmarkPickStartDone adds the in-flight accounting and the header formatting a
// request pays on top of Pick.
func BenchmarkPickStartDone(b *testing.B) {
	buf := make([]byte, 0, 128)
	benchRequests(b, func(tb *Table, key uint64, dst []int) []int {
		dst = tb.Pick(key, 1, 1, dst).Order
		tk := tb.Start(dst[0], 1)
		buf = tb.AppendAddrs(buf[:0], dst)
		tk.Done()
		return dst
	})
}

// BenchmarkPickHotKey is the spill path: one key whose first choices are over their
// bound, so Pick walks further down the key's order.
func BenchmarkPickHotKey(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			tb := loadedTable(b, n)
			const key = 0xabcdef
			for range 4 * n { // pile the hot key's requests on, as a shared system prompt would
				tb.Start(tb.Pick(key, 1, 1, nil).Order[0], 1)
			}
			dst := make([]int, 0, tb.cfg.Choices)
			b.ReportAllocs()
			for b.Loop() {
				dst = tb.Pick(key, 1, 1, dst).Order
			}
		})
	}
}

// BenchmarkRendezvousScan is the baseline the table replaces: weighted rendezvous
// hashing that scores every endpoint for every key, -ln(u)/w, keeping the best three.
func BenchmarkRendezvousScan(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			eps := fleet(n, skewed)
			hashes := make([]uint64, n)
			inv := make([]float64, n)
			for i, ep := range eps {
				hashes[i], inv[i] = addrHash(ep.Address), 1/ep.Weight
			}
			ks := keys(1<<14, 19)
			var best [3]int
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				best = scanTop3(ks[i&(len(ks)-1)], hashes, inv)
				i++
			}
			_ = best
		})
	}
}

func scanTop3(key uint64, hashes []uint64, inv []float64) [3]int {
	top := [3]int{-1, -1, -1}
	score := [3]float64{math.Inf(1), math.Inf(1), math.Inf(1)}
	for i, h := range hashes {
		u := float64(mix(key^h)>>11+1) * (1.0 / (1 << 53))
		s := -math.Log(u) * inv[i]
		for j := range 3 {
			if s < score[j] {
				copy(score[j+1:], score[j:2])
				copy(top[j+1:], top[j:2])
				score[j], top[j] = s, i
				break
			}
		}
	}
	return top
}

// BenchmarkNewTable is the cost of a swap: ranking every bucket at the default size.
func BenchmarkNewTable(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			eps := fleet(n, skewed)
			loads := NewLoads()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewTable(DefaultConfig(), eps, loads); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPickOverflow is the overflow path at its most expensive: every ranked
// endpoint is past Config.OverflowAt of its KV cache, so each Pick weighs all 8 overflow
// endpoints (decide.DefaultOverflowEngines) and sends the request to one of them.
func BenchmarkPickOverflow(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			loads := NewLoads()
			eps := fleet(n+8, skewed)
			for i := n; i < n+8; i++ {
				eps[i].Overflow = true
				eps[i].Address = fmt.Sprintf("10.9.0.%d:8000", i-n) // after the ranked ones in address order too
			}
			tb := mustTable(b, DefaultConfig(), eps, loads)
			for i := range tb.Len() + tb.Overflows() {
				loads.SetKVWritten(tb.Endpoint(i).Address, 0, 100_000)
				if i < tb.Len() {
					loads.SetObserved(tb.Endpoint(i).Address, 50_000)
				}
			}
			ks := keys(1<<14, 19)
			dst := make([]int, 0, tb.cfg.Choices)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r := tb.Pick(ks[i&(len(ks)-1)], 1_000, 0, dst)
				if !r.Overflowed {
					b.Fatal("no overflow")
				}
				dst = r.Order
				i++
			}
		})
	}
}

// BenchmarkPickRoom is a long prompt's pick with the room check on every candidate, its
// start and its end, without and with Pins: 100 marks (a 100,000-token prompt at 1,000 a
// mark), 64 requests in flight that pin the same 30-mark system prompt and their own rest,
// and every engine's cache stated. With pins, each candidate's room takes one bisection
// over the marks, the pick one more (Pins.Common), and the request's start and end count
// its 100 marks twice each; Pin copies the marks (one allocation).
func BenchmarkPickRoom(b *testing.B) {
	for _, pinned := range []bool{false, true} {
		b.Run(fmt.Sprintf("pins=%v", pinned), func(b *testing.B) {
			loads := NewLoads()
			cfg := DefaultConfig()
			tb := mustTable(b, cfg, fleet(16, equal), loads)
			for i := range tb.Len() {
				loads.Observe(tb.Endpoint(i).Address, Observation{KVCapacity: 450_000, KVHeld: 300_000},
					func(int64, int64, int64) int64 { return 200_000 })
			}
			var pins *Pins
			if pinned {
				pins = NewPins(1 << 19)
			}
			for r := range 64 {
				tk := tb.Start(r%tb.Len(), 100_000)
				pins.Pin(tb, r%tb.Len(), chain(100, 30, uint64(r)+1), &tk)
			}
			marks := chain(100, 30, 1<<20)
			ask := Ask{Work: 101_000, Move: 1_600_000, Home: -1, Prompt: 100_000, Marks: marks, Pins: pins, MarkTokens: 1_000}
			ks := keys(1<<14, 19)
			dst := make([]int, 0, cfg.Choices)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ask.Key = ks[i&(len(ks)-1)]
				dst = tb.PickFor(&ask, dst).Order
				tk := tb.Start(dst[0], ask.Work)
				pins.Pin(tb, dst[0], marks, &tk)
				tk.Done()
				i++
			}
		})
	}
}
