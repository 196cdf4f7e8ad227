package picker

import (
	"slices"
	"testing"
	"unsafe"
)

// A counter fills one 64-byte cache line: picks on different endpoints do not share
// lines, and a pick that reads one counter loads one line.
func TestACounterIsOneCacheLine(t *testing.T) {
	if got := unsafe.Sizeof(counter{}); got != 64 {
		t.Errorf("counter is %d bytes, want 64", got)
	}
}

// TestObserveRecordsAScrape: Observe stores what SetKVWritten, SetWaiting and SetObserved
// would, hands others this process's and its peers' figures on the address, and makes a
// counter only for an observation that holds something.
func TestObserveRecordsAScrape(t *testing.T) {
	loads := NewLoads()
	tb := mustTable(t, testConfig(), fleet(2, equal), loads)
	addr := tb.Endpoint(0).Address
	tk := tb.Start(0, 300)
	defer tk.Done()
	loads.SetPeers(map[string]int64{addr: 200, "10.9.9.9:8000": 50}, 200)

	var gotN, gotW, gotP int64
	loads.Observe(addr, Observation{KVWritten: 5_000, KVCapacity: 100_000, Waiting: 2}, func(n, w, p int64) int64 {
		gotN, gotW, gotP = n, w, p
		return 1_000 - w - p
	})
	if gotN != 1 || gotW != 300 || gotP != 200 {
		t.Errorf("others saw requests %d, work %d, peers' work %d; want 1, 300, 200", gotN, gotW, gotP)
	}
	if x, q := loads.Observed(addr), tb.Waiting(0); x != 500 || q != 2 {
		t.Errorf("observed %d and waiting %d, want 500 and 2", x, q)
	}
	if fill, ok := tb.CacheFill(0, 0); !ok || fill <= 0 {
		t.Errorf("cache fill %v (%v): the KV capacity was not recorded", fill, ok)
	}
	// Negative figures are clamped as the setters clamp them; no capacity forgets the writes.
	loads.Observe(addr, Observation{KVWritten: 5_000, Waiting: -3}, func(int64, int64, int64) int64 { return -7 })
	if _, ok := tb.CacheFill(0, 0); ok || loads.Observed(addr) != 0 || tb.Waiting(0) != 0 {
		t.Error("an empty observation left the previous one's figures")
	}

	// An address with no counter gets one only when the observation holds something;
	// its others see the peers' work on it.
	const stranger = "10.9.9.9:8000"
	loads.Observe(stranger, Observation{}, func(_, _, p int64) int64 { gotP = p; return 0 })
	if id := loads.ID(stranger); id != 0 || gotP != 50 {
		t.Errorf("an empty observation of a stranger: id %d (want none), peers' work %d (want 50)", id, gotP)
	}
	loads.Observe(stranger, Observation{}, func(int64, int64, int64) int64 { return 70 })
	if loads.ID(stranger) == 0 || loads.Observed(stranger) != 70 || loads.Peers(stranger) != 50 {
		t.Errorf("a stranger's observed work: id %d, observed %d, peers %d", loads.ID(stranger), loads.Observed(stranger), loads.Peers(stranger))
	}
}

// TestEachIsInAddressOrder: Each visits the addresses with work in flight sorted, through
// counters made in any order and pruned.
func TestEachIsInAddressOrder(t *testing.T) {
	loads := NewLoads()
	eps := fleet(6, equal)
	slices.Reverse(eps)
	tb := mustTable(t, testConfig(), eps, loads)
	for i := range tb.Len() {
		defer tb.Start(i, 1).Done()
	}
	loads.SetObserved("10.0.0.9:8000", 5) // a counter with nothing in flight: not visited
	eps[2].Weight = 0
	loads.Prune(mustTable(t, testConfig(), eps[2:], loads))
	var got []string
	loads.Each(func(addr string, n, w int64) {
		if n != 1 || w != 1 {
			t.Errorf("%s: %d requests, %d work; want 1, 1", addr, n, w)
		}
		got = append(got, addr)
	})
	if len(got) != 6 || !slices.IsSorted(got) {
		t.Errorf("Each visited %v, want the 6 addresses in flight, sorted", got)
	}
}
