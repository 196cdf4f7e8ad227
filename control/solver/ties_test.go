package solver

import (
	"fmt"
	"math"
	"testing"
)

// regionsOfFour is clusters "a" and "b", each next to four engines of its own region and
// 40 ms from the other's; engine capacity 10 req/s.
func regionsOfFour(demandA, demandB float64) *Problem {
	p := &Problem{Clusters: []string{"a", "b"}, Models: []string{"m"}, Params: DefaultParams(),
		Demand: [][]float64{{demandA}, {demandB}}}
	p.RTT = make([][]float64, 2)
	for r, region := range []string{"a", "b"} {
		for i := range 4 {
			p.Engines = append(p.Engines, Engine{Name: fmt.Sprintf("%s-%d", region, i), Models: []int{0},
				Capacity: 10, Healthy: true, Curve: Curve{Base: 0.2, Queue: 0.2}})
			for c := range p.Clusters {
				rtt := 0.001
				if c != r {
					rtt = 0.041
				}
				p.RTT[c] = append(p.RTT[c], rtt)
			}
		}
	}
	return p
}

// A cluster's flow to a region of equal engines is split evenly among them, whatever
// vertex the LP lands on, and stays split evenly as demand moves: no engine's flow from
// a cluster goes up while another's of the same region goes down.
func TestInterchangeableEnginesShareEachFlowEvenly(t *testing.T) {
	var prev *Solution
	for i, d := range []float64{33, 34.5, 33.2, 35.9, 32.1, 34} {
		p := regionsOfFour(d, 20)
		p.Prev = prev
		sol := mustSolve(t, p)
		for c := range p.Clusters {
			for r := range 2 {
				flows := sol.Flow[c][0][4*r : 4*r+4]
				for _, x := range flows {
					if math.Abs(x-flows[0]) > 1e-9 {
						t.Fatalf("solve %d: cluster %s's flows to region %d's engines %v, want one value", i, p.Clusters[c], r, flows)
					}
				}
			}
		}
		if i == 0 && sol.Flow[0][0][4] == 0 {
			t.Fatalf("cluster a at %v req/s against b's 20 sends nothing to b: the test needs a spill", d)
		}
		prev = sol
	}
}

// Engines that differ (a penalty lowered one's capacity) keep their own shares.
func TestEnginesThatDifferAreNotAveraged(t *testing.T) {
	p := regionsOfFour(20, 20)
	p.Engines[1].Capacity = 5
	sol := mustSolve(t, p)
	a := sol.Flow[0][0]
	if !(a[1] < a[0]-1e-6) || math.Abs(a[0]-a[2]) > 1e-9 || math.Abs(a[0]-a[3]) > 1e-9 {
		t.Fatalf("flows from a %v: want a-1 (half the capacity) below the other three, which are equal", a[:4])
	}
}

// A price on moves the LP weighs once against one period's gain holds a flow where it is:
// with a symmetric 0.3 s price, the east flow that spilled west in a surge stays west at
// its share (10.6 of 85 req/s, then 3.7 of 30) after the surge. Priced only for leaving
// for a far engine (FarMoveCost), the flow spills less and comes home when the surge ends.
func TestAFarMoveIsPricedToLeaveNotToComeBack(t *testing.T) {
	west := func(mu, far float64) []float64 {
		t.Helper()
		var prev *Solution
		var out []float64
		for _, d := range []float64{30, 85, 30} {
			p := twoRegions(d, 20, Curve{Base: 0.1, Queue: 0.05}, 100)
			p.Params.MoveCost, p.Params.FarMoveCost = mu, far
			p.Prev = prev
			prev = mustSolve(t, p)
			out = append(out, prev.Flow[0][0][1])
		}
		return out
	}
	free, sym, far := west(0.005, 0), west(0.3, 0), west(0.005, 0.3)
	if !(sym[2] > 1) {
		t.Errorf("symmetric price: east's flow west after the surge %.2f req/s; the test expects the myopic LP to hold some there", sym[2])
	}
	if far[2] > 1e-9 {
		t.Errorf("far-move price: %.2f req/s of east's flow stays west after the surge, want none", far[2])
	}
	if !(far[1] > 0 && far[1] < free[1]) {
		t.Errorf("in the surge east spills %.2f req/s west with the far-move price, %.2f without: want some, and less", far[1], free[1])
	}
}
