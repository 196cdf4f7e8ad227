package guard

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/meridian-router/meridian/policy"
)

// RetryConfig configures Retries.
type RetryConfig struct {
	// Curve applies until the control server sends its own (SetCurve).
	Curve policy.RetryCurve
	// Ratio is the long-run cap on retries per request: each request adds Ratio retry
	// credits, each retry Envoy makes spends one.
	Ratio float64
	// Burst is the most credits that can accumulate (and the most debt that is
	// remembered), in retries.
	Burst float64
}

// DefaultRetryConfig returns the sidecar's defaults: policy.DefaultRetryCurve, and at most
// one retry per ten requests over time.
func DefaultRetryConfig() RetryConfig {
	return RetryConfig{Curve: policy.DefaultRetryCurve(), Ratio: 0.1, Burst: 20}
}

// Validate reports every field that is out of range, named by its YAML path (retry.*).
func (c RetryConfig) Validate() error {
	var errs []error
	if err := c.Curve.Validate("retry"); err != nil {
		errs = append(errs, err)
	}
	if !(c.Ratio >= 0 && c.Ratio <= 1) {
		errs = append(errs, fmt.Errorf("retry.ratio is %v: want in [0, 1]", c.Ratio))
	}
	if !(c.Burst >= 1) || math.IsInf(c.Burst, 0) {
		errs = append(errs, fmt.Errorf("retry.burst is %v: want a finite value >= 1", c.Burst))
	}
	return errors.Join(errs...)
}

// RetryGrant is what one request may do: the values of x-envoy-max-retries and
// x-envoy-retry-on. Max 0 means "set x-envoy-max-retries: 0".
type RetryGrant struct {
	Max     uint32
	RetryOn string
}

// Retries is the dynamic retry budget. Allow runs per request; Spent is fed the retries
// Envoy actually made (from access logs), which drains the credit bucket. Retries that are
// never reported are not charged, so Envoy's circuit_breakers.thresholds.retry_budget stays
// the backstop. Safe for concurrent use and lock-free: the curve is an atomically swapped
// pointer and the bucket a float64 updated by compare-and-swap.
type Retries struct {
	curve   atomic.Pointer[policy.RetryCurve]
	ratio   float64
	burst   float64
	credits atomic.Uint64 // float64 bits
}

// NewRetries returns a budget with a full credit bucket.
func NewRetries(cfg RetryConfig) (*Retries, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Retries{ratio: cfg.Ratio, burst: cfg.Burst}
	c := cfg.Curve
	r.curve.Store(&c)
	r.credits.Store(math.Float64bits(cfg.Burst))
	return r, nil
}

// SetCurve replaces the curve (a new Policy from the control server). A bad curve is
// refused and the current one stays.
func (r *Retries) SetCurve(c policy.RetryCurve) error {
	if err := c.Validate("retry_budget"); err != nil {
		return err
	}
	r.curve.Store(&c)
	return nil
}

// Curve returns the curve in force.
func (r *Retries) Curve() policy.RetryCurve { return *r.curve.Load() }

// update applies f to the credits atomically and returns the value it stored.
func (r *Retries) update(f func(float64) float64) float64 {
	for {
		old := r.credits.Load()
		v := f(math.Float64frombits(old))
		if r.credits.CompareAndSwap(old, math.Float64bits(v)) {
			return v
		}
	}
}

// Allow returns the retry grant for one new request at utilization u: the curve's
// allowance, cut to the whole credits in the bucket.
func (r *Retries) Allow(u float64) RetryGrant {
	c := r.curve.Load()
	credits := r.update(func(v float64) float64 { return min(r.burst, v+r.ratio) })
	n := c.MaxRetries(u)
	if avail := math.Floor(credits); float64(n) > avail {
		n = uint32(max(avail, 0))
	}
	return RetryGrant{Max: n, RetryOn: c.RetryOn}
}

// Spent charges n retries that Envoy made.
func (r *Retries) Spent(n int) {
	if n <= 0 {
		return
	}
	r.update(func(v float64) float64 { return max(-r.burst, v-float64(n)) })
}
