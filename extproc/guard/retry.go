package guard

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
)

// maxRetriesCap bounds RetryCurve.MaxRetriesIdle: beyond a few attempts a retry only
// adds load, and Envoy's own default is 1.
const maxRetriesCap = 10

// RetryCurve maps utilization u in [0, 1] to retries per request: MaxRetriesIdle while
// u ≤ GenerousBelow, 0 once u ≥ ZeroAt, and linear in between (rounded down, so the
// budget never exceeds the line). It is the meridian.v1.RetryBudget policy.
type RetryCurve struct {
	MaxRetriesIdle uint32
	GenerousBelow  float64
	ZeroAt         float64
	// RetryOn is copied into x-envoy-retry-on, for example "5xx,reset,connect-failure".
	RetryOn string
}

// Validate reports every field that is out of range, naming it.
func (c RetryCurve) Validate() error {
	var errs []error
	if c.MaxRetriesIdle > maxRetriesCap {
		errs = append(errs, fmt.Errorf("guard: retry.maxRetriesIdle is %d: want 0..%d", c.MaxRetriesIdle, maxRetriesCap))
	}
	if !(c.GenerousBelow >= 0 && c.GenerousBelow < c.ZeroAt && c.ZeroAt <= 1) {
		errs = append(errs, fmt.Errorf("guard: retry.generousBelow %v and retry.zeroAt %v: want 0 <= generousBelow < zeroAt <= 1",
			c.GenerousBelow, c.ZeroAt))
	}
	if c.MaxRetriesIdle > 0 && c.RetryOn == "" {
		errs = append(errs, errors.New("guard: retry.retryOn is empty: Envoy retries nothing without it (or set maxRetriesIdle to 0)"))
	}
	if strings.ContainsFunc(c.RetryOn, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		errs = append(errs, fmt.Errorf("guard: retry.retryOn %q has spaces or control characters: want a comma-separated list of Envoy retry conditions", c.RetryOn))
	}
	return errors.Join(errs...)
}

// MaxRetries returns the retries the curve allows at utilization u. A NaN u counts
// as saturated.
func (c RetryCurve) MaxRetries(u float64) uint32 {
	switch {
	case math.IsNaN(u) || u >= c.ZeroAt:
		return 0
	case u <= c.GenerousBelow:
		return c.MaxRetriesIdle
	}
	frac := (c.ZeroAt - u) / (c.ZeroAt - c.GenerousBelow)
	return uint32(math.Floor(float64(c.MaxRetriesIdle) * frac))
}

// RetryConfig configures Retries.
type RetryConfig struct {
	// Curve applies until the control server sends its own (SetCurve).
	Curve RetryCurve
	// Ratio is the long-run cap on retries per request: each request adds Ratio
	// retry credits, each retry Envoy makes spends one.
	Ratio float64
	// Burst is the most credits that can accumulate (and the most debt that is
	// remembered), in retries.
	Burst float64
}

// DefaultRetryConfig returns the sidecar's defaults: up to 2 retries while the fleet
// is below 50% utilization, none from 90%, and at most one retry per ten requests over
// time.
func DefaultRetryConfig() RetryConfig {
	return RetryConfig{
		Curve: RetryCurve{MaxRetriesIdle: 2, GenerousBelow: 0.5, ZeroAt: 0.9, RetryOn: "5xx,reset,connect-failure"},
		Ratio: 0.1,
		Burst: 20,
	}
}

// Validate reports every field that is out of range, naming it.
func (c RetryConfig) Validate() error {
	var errs []error
	if err := c.Curve.Validate(); err != nil {
		errs = append(errs, err)
	}
	if !(c.Ratio >= 0 && c.Ratio <= 1) {
		errs = append(errs, fmt.Errorf("guard: retry.ratio is %v: want in [0, 1]", c.Ratio))
	}
	if !(c.Burst >= 1) || math.IsInf(c.Burst, 0) {
		errs = append(errs, fmt.Errorf("guard: retry.burst is %v: want a finite value >= 1", c.Burst))
	}
	return errors.Join(errs...)
}

// RetryGrant is what one request may do: the values of x-envoy-max-retries and
// x-envoy-retry-on. Max 0 means "set x-envoy-max-retries: 0".
type RetryGrant struct {
	Max     uint32
	RetryOn string
}

// Retries is the dynamic retry budget. Allow runs per request; Spent is fed the
// retries Envoy actually made (from access logs), which drains the credit bucket.
// Retries that are never reported are not charged, so Envoy's
// circuit_breakers.thresholds.retry_budget stays the backstop. Safe for concurrent use.
type Retries struct {
	mu      sync.Mutex
	curve   RetryCurve
	ratio   float64
	burst   float64
	credits float64
}

// NewRetries returns a budget with a full credit bucket.
func NewRetries(cfg RetryConfig) (*Retries, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Retries{curve: cfg.Curve, ratio: cfg.Ratio, burst: cfg.Burst, credits: cfg.Burst}, nil
}

// SetCurve replaces the curve (a new Policy from the control server). A bad curve is
// refused and the current one stays.
func (r *Retries) SetCurve(c RetryCurve) error {
	if err := c.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	r.curve = c
	r.mu.Unlock()
	return nil
}

// Allow returns the retry grant for one new request at utilization u: the curve's
// allowance, cut to the whole credits in the bucket.
func (r *Retries) Allow(u float64) RetryGrant {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.credits = min(r.burst, r.credits+r.ratio)
	n := r.curve.MaxRetries(u)
	if avail := math.Floor(r.credits); float64(n) > avail {
		n = uint32(max(avail, 0))
	}
	return RetryGrant{Max: n, RetryOn: r.curve.RetryOn}
}

// Spent charges n retries that Envoy made.
func (r *Retries) Spent(n int) {
	if n <= 0 {
		return
	}
	r.mu.Lock()
	r.credits = max(-r.burst, r.credits-float64(n))
	r.mu.Unlock()
}
