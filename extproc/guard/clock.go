package guard

import (
	"math"
	"time"
)

// Clock tells the time. The sidecar uses SystemClock; tests and the simulator pass a
// clock they advance themselves.
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock (with Go's monotonic reading, so intervals are immune
// to clock steps).
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// halfLifeDecay is the factor by which something with the given half-life shrinks over
// dt: 2^(-dt/halfLife). Negative dt (a clock going backwards) decays nothing.
func halfLifeDecay(dt, halfLife time.Duration) float64 {
	if dt <= 0 {
		return 1
	}
	return math.Exp2(-float64(dt) / float64(halfLife))
}
