package guard

import (
	"math"
	"strings"
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

// The budget is generous when idle, shrinks as utilization rises and is zero near
// saturation, whatever credit is left.
func TestRetriesReachZeroNearSaturation(t *testing.T) {
	r, err := NewRetries(DefaultRetryConfig())
	if err != nil {
		t.Fatal(err)
	}
	zeroAt := DefaultRetryConfig().Curve.ZeroAt
	prev := uint32(math.MaxUint32)
	for i := 0; i <= 100; i++ {
		u := float64(i) / 100
		g := r.Allow(u)
		if g.Max > prev {
			t.Fatalf("retries rose from %d to %d at u = %.2f", prev, g.Max, u)
		}
		if u >= zeroAt && g.Max != 0 {
			t.Fatalf("u = %.2f (≥ zeroAt %.2f): %d retries allowed, want 0", u, zeroAt, g.Max)
		}
		if i == 0 && g.Max != DefaultRetryConfig().Curve.MaxRetriesIdle {
			t.Fatalf("idle: %d retries, want the idle maximum %d", g.Max, DefaultRetryConfig().Curve.MaxRetriesIdle)
		}
		if g.RetryOn != DefaultRetryConfig().Curve.RetryOn {
			t.Fatalf("RetryOn = %q", g.RetryOn)
		}
		prev = g.Max
	}
}

// When Envoy uses every retry it is given, the retry ratio over time stays within
// Ratio (plus the initial burst).
func TestRetryRatioIsCapped(t *testing.T) {
	for _, ratio := range []float64{0, 0.05, 0.2} {
		cfg := DefaultRetryConfig()
		cfg.Ratio, cfg.Burst = ratio, 5
		r, err := NewRetries(cfg)
		if err != nil {
			t.Fatal(err)
		}
		const requests = 20000
		retries := 0
		for range requests {
			g := r.Allow(0) // idle: the curve alone would allow 2 every time
			retries += int(g.Max)
			r.Spent(int(g.Max))
		}
		if limit := ratio*requests + cfg.Burst; float64(retries) > limit {
			t.Errorf("ratio %v: %d retries over %d requests, want at most %v", ratio, retries, requests, limit)
		}
		if float64(retries) < ratio*requests*0.95 {
			t.Errorf("ratio %v: only %d retries over %d requests: the bucket refills too slowly", ratio, retries, requests)
		}
	}
}

func TestSetCurveRefusesBadCurves(t *testing.T) {
	r, _ := NewRetries(DefaultRetryConfig())
	if err := r.SetCurve(RetryCurve{MaxRetriesIdle: 1, GenerousBelow: 0.9, ZeroAt: 0.5, RetryOn: "5xx"}); err == nil {
		t.Fatal("SetCurve accepted generousBelow > zeroAt")
	}
	if g := r.Allow(0); g.Max != DefaultRetryConfig().Curve.MaxRetriesIdle {
		t.Fatalf("after a refused curve, idle grant is %d, want the old curve's %d", g.Max, DefaultRetryConfig().Curve.MaxRetriesIdle)
	}
	if err := r.SetCurve(RetryCurve{MaxRetriesIdle: 0, GenerousBelow: 0, ZeroAt: 1}); err != nil {
		t.Fatalf("SetCurve(no retries) = %v", err)
	}
	if g := r.Allow(0); g.Max != 0 {
		t.Fatalf("curve with no retries granted %d", g.Max)
	}
}

func TestRetryValidate(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*RetryConfig)
	}{
		{"maxRetriesIdle", func(c *RetryConfig) { c.Curve.MaxRetriesIdle = 11 }},
		{"zeroAt", func(c *RetryConfig) { c.Curve.ZeroAt = 1.5 }},
		{"generousBelow", func(c *RetryConfig) { c.Curve.GenerousBelow = -0.1 }},
		{"retryOn", func(c *RetryConfig) { c.Curve.RetryOn = "" }},
		{"retryOn", func(c *RetryConfig) { c.Curve.RetryOn = "5xx, reset" }},
		{"ratio", func(c *RetryConfig) { c.Ratio = -0.1 }},
		{"burst", func(c *RetryConfig) { c.Burst = 0.5 }},
	} {
		c := DefaultRetryConfig()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Validate() = %v, want an error naming %s", err, tc.field)
		}
		if _, err := NewRetries(c); err == nil {
			t.Errorf("NewRetries accepted a bad %s", tc.field)
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
