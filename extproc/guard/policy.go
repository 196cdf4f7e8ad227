package guard

import (
	"fmt"

	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// CurveFromProto converts the control server's retry budget. A nil message is an
// error: the caller keeps its current curve.
func CurveFromProto(b *meridianv1.RetryBudget) (RetryCurve, error) {
	if b == nil {
		return RetryCurve{}, fmt.Errorf("guard: policy has no retry_budget")
	}
	c := RetryCurve{
		MaxRetriesIdle: b.GetMaxRetriesIdle(),
		GenerousBelow:  b.GetGenerousBelow(),
		ZeroAt:         b.GetZeroAt(),
		RetryOn:        b.GetRetryOn(),
	}
	if err := c.Validate(); err != nil {
		return RetryCurve{}, fmt.Errorf("policy retry_budget: %w", err)
	}
	return c, nil
}

// FractionsFromProto converts the policy's shed list into SetFractions' map, refusing
// duplicates, unnamed models and fractions outside [0, 1].
func FractionsFromProto(shed []*meridianv1.ModelShed) (map[string]float64, error) {
	out := make(map[string]float64, len(shed))
	for i, s := range shed {
		m, f := s.GetModel(), s.GetFraction()
		switch _, dup := out[m]; {
		case m == "":
			return nil, fmt.Errorf("guard: policy shed[%d] has no model", i)
		case dup:
			return nil, fmt.Errorf("guard: policy shed[%d] repeats model %q", i, m)
		case !(f >= 0 && f <= 1):
			return nil, fmt.Errorf("guard: policy shed[%d] (model %q) has fraction %v: want in [0, 1]", i, m, f)
		}
		out[m] = f
	}
	return out, nil
}
