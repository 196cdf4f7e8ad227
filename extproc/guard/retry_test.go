package guard

import (
	"math"
	"strings"
	"testing"

	"github.com/meridian-router/meridian/policy"
)

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
	if err := r.SetCurve(policy.RetryCurve{MaxRetriesIdle: 1, GenerousBelow: 0.9, ZeroAt: 0.5, RetryOn: "5xx"}); err == nil {
		t.Fatal("SetCurve accepted generousBelow > zeroAt")
	}
	if g := r.Allow(0); g.Max != DefaultRetryConfig().Curve.MaxRetriesIdle {
		t.Fatalf("after a refused curve, idle grant is %d, want the old curve's %d", g.Max, DefaultRetryConfig().Curve.MaxRetriesIdle)
	}
	if err := r.SetCurve(policy.RetryCurve{MaxRetriesIdle: 0, GenerousBelow: 0, ZeroAt: 1}); err != nil {
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
		{"retry.max_retries_idle", func(c *RetryConfig) { c.Curve.MaxRetriesIdle = 11 }},
		{"retry.zero_at", func(c *RetryConfig) { c.Curve.ZeroAt = 1.5 }},
		{"retry.generous_below", func(c *RetryConfig) { c.Curve.GenerousBelow = -0.1 }},
		{"retry.retry_on", func(c *RetryConfig) { c.Curve.RetryOn = "" }},
		{"retry.retry_on", func(c *RetryConfig) { c.Curve.RetryOn = "5xx, reset" }},
		{"retry.ratio", func(c *RetryConfig) { c.Ratio = -0.1 }},
		{"retry.burst", func(c *RetryConfig) { c.Burst = 0.5 }},
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
