package sim

import (
	"math"
	"slices"
)

// rendezvous ranks engines for a key by weighted rendezvous hashing: engine e scores
// -ln(u)/w[e] with u uniform in (0, 1] from hash(key, e), lowest first, so e ranks first
// with probability w[e]/Σw and a weight change moves only the keys the changed engine
// wins or loses. Engines with weight 0 are left out. It writes into dst and returns it.
func rendezvous(key uint64, w []float64, dst []int, score []float64) []int {
	dst = dst[:0]
	for e, we := range w {
		if we <= 0 {
			continue
		}
		u := (float64(mix(key, uint64(e)+1)>>11) + 1) / (1 << 53)
		score[e] = -math.Log(u) / we
		dst = append(dst, e)
	}
	slices.SortFunc(dst, func(a, b int) int {
		switch {
		case score[a] < score[b]:
			return -1
		case score[a] > score[b]:
			return 1
		}
		return a - b
	})
	return dst
}
