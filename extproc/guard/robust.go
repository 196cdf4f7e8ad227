package guard

import (
	"math"
	"slices"
)

// madScale makes the median absolute deviation estimate the standard deviation of
// normally distributed data (1/Φ⁻¹(3/4)).
const madScale = 1.4826

// median returns the median of xs, reordering xs. It returns 0 for no values.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// medianMAD returns the median of xs and their median absolute deviation, scaled to
// estimate a standard deviation. xs is not modified.
func medianMAD(xs []float64) (med, sd float64) {
	scratch := slices.Clone(xs)
	med = median(scratch)
	for i, x := range xs {
		scratch[i] = math.Abs(x - med)
	}
	return med, madScale * median(scratch)
}
