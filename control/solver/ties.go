package solver

import (
	"encoding/binary"
	"math"
	"slices"
)

// spreadTies gives every engine of a class of interchangeable engines the same share of
// each (cluster, model) flow the class carries: the class's flow, split evenly.
//
// Engines are interchangeable when they serve the same models at the same capacity and
// curve and every cluster reaches them at the same RTT (the engines of one region, in
// practice). The LP's optimum over such engines is degenerate: with a piecewise-linear
// cost, any split that keeps each engine's load on the same segment costs the same, so
// the simplex returns whichever vertex it reaches, and a small change of demand can move
// a cluster's flow from one engine of the class to another with the others' flows
// moving back. Each such reshuffle republishes weights and moves prefix keys between
// engines for nothing. The even split costs no more: every engine of the class carries
// the class's mean load, which a convex cost never prices above the loads it averages
// (Jensen), the RTT term is unchanged, and, when the previous solution was spread the
// same way (every solution is), the movement term is no larger either (Σ|x−p| ≥ n·|x̄−p|
// for a common previous share p).
func (s *Solution) spreadTies(p *Problem, ix *index) {
	for _, class := range tieClasses(p, ix) {
		if len(class) < 2 {
			continue
		}
		n := float64(len(class))
		for c := range s.Flow {
			for m := range s.Flow[c] {
				total := 0.0
				for _, e := range class {
					total += s.Flow[c][m][e]
				}
				for _, e := range class {
					s.Flow[c][m][e] = total / n
				}
			}
		}
	}
}

// tieClasses groups the usable engines that are interchangeable (see spreadTies), each
// class in ascending engine order.
func tieClasses(p *Problem, ix *index) [][]int {
	byKey := map[string]int{}
	var classes [][]int
	key := make([]byte, 0, 8*(3+len(p.Clusters)))
	for e := range p.Engines {
		if ix.segs[e] == nil {
			continue
		}
		eng := &p.Engines[e]
		key = key[:0]
		models := slices.Clone(eng.Models)
		slices.Sort(models)
		for _, m := range models {
			key = binary.LittleEndian.AppendUint64(key, uint64(m))
		}
		key = append(key, 0xff) // models end here: the rest is fixed-width
		for _, v := range []float64{eng.Capacity, eng.Curve.Base, eng.Curve.Queue} {
			key = binary.LittleEndian.AppendUint64(key, math.Float64bits(v))
		}
		for c := range p.Clusters {
			key = binary.LittleEndian.AppendUint64(key, math.Float64bits(p.RTT[c][e]))
		}
		i, ok := byKey[string(key)]
		if !ok {
			i = len(classes)
			byKey[string(key)] = i
			classes = append(classes, nil)
		}
		classes[i] = append(classes[i], e)
	}
	return classes
}
