package policy

import (
	"errors"
	"fmt"
	"math"
	"strings"

	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// MaxRetriesCap bounds RetryCurve.MaxRetriesIdle: beyond a few attempts a retry only adds
// load, and Envoy's own default is 1.
const MaxRetriesCap = 10

// RetryCurve maps utilization u in [0, 1] to retries per request: MaxRetriesIdle while
// u ≤ GenerousBelow, 0 once u ≥ ZeroAt, and linear in between (rounded down, so the budget
// never exceeds the line). It is the meridian.v1.RetryBudget policy.
type RetryCurve struct {
	MaxRetriesIdle uint32
	GenerousBelow  float64
	ZeroAt         float64
	// RetryOn is copied into x-envoy-retry-on, for example "5xx,reset,connect-failure".
	RetryOn string
}

// DefaultRetryCurve is the budget meridian ships with: up to 2 retries while the fleet is
// below 50% utilization, none from 90%.
func DefaultRetryCurve() RetryCurve {
	return RetryCurve{MaxRetriesIdle: 2, GenerousBelow: 0.5, ZeroAt: 0.9, RetryOn: "5xx,reset,connect-failure"}
}

// Validate reports every field that is out of range, named by its YAML path under prefix
// (for example "retry").
func (c RetryCurve) Validate(prefix string) error {
	var errs []error
	if c.MaxRetriesIdle > MaxRetriesCap {
		errs = append(errs, fmt.Errorf("%s.max_retries_idle is %d: want 0..%d", prefix, c.MaxRetriesIdle, MaxRetriesCap))
	}
	if !(c.GenerousBelow >= 0 && c.GenerousBelow < c.ZeroAt && c.ZeroAt <= 1) {
		errs = append(errs, fmt.Errorf("%s.generous_below %v and %s.zero_at %v: want 0 <= generous_below < zero_at <= 1",
			prefix, c.GenerousBelow, prefix, c.ZeroAt))
	}
	if c.MaxRetriesIdle > 0 && c.RetryOn == "" {
		errs = append(errs, fmt.Errorf("%s.retry_on is empty: Envoy retries nothing without it (or set %s.max_retries_idle to 0)", prefix, prefix))
	}
	if strings.ContainsFunc(c.RetryOn, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		errs = append(errs, fmt.Errorf("%s.retry_on %q has spaces or control characters: want a comma-separated list of Envoy retry conditions", prefix, c.RetryOn))
	}
	return errors.Join(errs...)
}

// MaxRetries returns the retries the curve allows at utilization u. A NaN u counts as
// saturated.
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

// Proto is c as the policy message carries it.
func (c RetryCurve) Proto() *meridianv1.RetryBudget {
	return &meridianv1.RetryBudget{MaxRetriesIdle: c.MaxRetriesIdle, GenerousBelow: c.GenerousBelow, ZeroAt: c.ZeroAt, RetryOn: c.RetryOn}
}

// CurveFromProto converts the control server's retry budget. A nil message is an error:
// the caller keeps its current curve.
func CurveFromProto(b *meridianv1.RetryBudget) (RetryCurve, error) {
	if b == nil {
		return RetryCurve{}, errors.New("policy has no retry_budget")
	}
	c := RetryCurve{MaxRetriesIdle: b.GetMaxRetriesIdle(), GenerousBelow: b.GetGenerousBelow(), ZeroAt: b.GetZeroAt(), RetryOn: b.GetRetryOn()}
	if err := c.Validate("retry_budget"); err != nil {
		return RetryCurve{}, fmt.Errorf("policy: %w", err)
	}
	return c, nil
}

// FractionsFromProto converts the policy's shed list into a model -> fraction map, refusing
// duplicates, unnamed models and fractions outside [0, 1].
func FractionsFromProto(shed []*meridianv1.ModelShed) (map[string]float64, error) {
	out := make(map[string]float64, len(shed))
	for i, s := range shed {
		m, f := s.GetModel(), s.GetFraction()
		switch _, dup := out[m]; {
		case m == "":
			return nil, fmt.Errorf("policy: shed[%d] has no model", i)
		case dup:
			return nil, fmt.Errorf("policy: shed[%d] repeats model %q", i, m)
		case !(f >= 0 && f <= 1):
			return nil, fmt.Errorf("policy: shed[%d] (model %q) has fraction %v: want in [0, 1]", i, m, f)
		}
		out[m] = f
	}
	return out, nil
}
