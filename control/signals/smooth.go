package signals

import (
	"math"
	"time"
)

// ewma is an exponentially weighted moving average in which each
// observation counts for the time span it covers: an observation spanning
// one half-life moves the average halfway to it. The first observation sets
// the value.
type ewma struct {
	v   float64
	set bool
}

func (e *ewma) add(x float64, span, halfLife time.Duration) {
	if !e.set {
		e.v, e.set = x, true
		return
	}
	a := 1 - math.Exp2(-span.Seconds()/halfLife.Seconds())
	e.v += a * (x - e.v)
}

// value returns the average, or def before any observation.
func (e ewma) value(def float64) float64 {
	if !e.set {
		return def
	}
	return e.v
}
