package policy

import (
	"math"
	"testing"

	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

func TestRetryCurve(t *testing.T) {
	c := RetryCurve{MaxRetriesIdle: 3, GenerousBelow: 0.4, ZeroAt: 0.8, RetryOn: "5xx"}
	for _, tc := range []struct {
		u    float64
		want uint32
	}{
		{0, 3}, {0.4, 3}, {0.5, 2}, {0.6, 1}, {0.7, 0}, {0.79, 0}, {0.8, 0}, {1, 0}, {1.7, 0},
		{math.NaN(), 0}, {-1, 3},
	} {
		if got := c.MaxRetries(tc.u); got != tc.want {
			t.Errorf("MaxRetries(%v) = %d, want %d", tc.u, got, tc.want)
		}
	}
}

func TestCurveFromProto(t *testing.T) {
	got, err := CurveFromProto(&meridianv1.RetryBudget{MaxRetriesIdle: 2, GenerousBelow: 0.3, ZeroAt: 0.7, RetryOn: "5xx,reset"})
	want := RetryCurve{MaxRetriesIdle: 2, GenerousBelow: 0.3, ZeroAt: 0.7, RetryOn: "5xx,reset"}
	if err != nil || got != want {
		t.Fatalf("CurveFromProto = %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []*meridianv1.RetryBudget{nil, {MaxRetriesIdle: 2, ZeroAt: 0.5}, {GenerousBelow: 0.5, ZeroAt: 0.5}} {
		if _, err := CurveFromProto(bad); err == nil {
			t.Errorf("CurveFromProto(%v) accepted a bad budget", bad)
		}
	}
}

func TestFractionsFromProto(t *testing.T) {
	got, err := FractionsFromProto([]*meridianv1.ModelShed{{Model: "a", Fraction: 0.2}, {Model: "b", Fraction: 0}})
	if err != nil || len(got) != 2 || got["a"] != 0.2 || got["b"] != 0 {
		t.Fatalf("FractionsFromProto = %v, %v", got, err)
	}
	for name, bad := range map[string][]*meridianv1.ModelShed{
		"duplicate": {{Model: "a", Fraction: 0.1}, {Model: "a", Fraction: 0.2}},
		"unnamed":   {{Fraction: 0.1}},
		"too-big":   {{Model: "a", Fraction: 1.5}},
	} {
		if _, err := FractionsFromProto(bad); err == nil {
			t.Errorf("%s: FractionsFromProto accepted %v", name, bad)
		}
	}
}
