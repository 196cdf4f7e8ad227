package decide

import (
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/meridian-router/meridian/enginemetrics"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

func quotaCore(t *testing.T, quotaAt float64) *Core {
	t.Helper()
	c := overflowViewCore(t, func(c *Config) { c.QuotaAt = quotaAt })
	// The control server asks to shed every request of model a.
	if err := c.ApplyPolicy(&meridianv1.Policy{Version: "v", Shed: []*meridianv1.ModelShed{{Model: "a", Fraction: 1}}}); err != nil {
		t.Fatal(err)
	}
	return c
}

// The control server's shed quota takes only requests whose engine would hold more than
// QuotaAt of its KV cache in work, or holds requests waiting; with QuotaAt 0, or an
// engine that states no cache, it takes every request it asks for.
func TestQuotaShedsOnlyWhatTheEngineWouldQueue(t *testing.T) {
	local := []string{"127.0.0.1:8000", "127.0.0.1:8001"}
	route := func(c *Core, key uint64) Decision {
		return c.Route(Request{Model: "a", Key: key, BodyBytes: 2000 * BytesPerToken}, make([]int, 0, 8))
	}
	c := quotaCore(t, DefaultQuotaAt)
	// Engines not scraped yet: their caches are unknown, so the quota applies as sent.
	if d := route(c, 1); d.Verdict != ShedQuota {
		t.Fatalf("caches unknown: verdict %v, want %v", d.Verdict, ShedQuota)
	}
	// Both engines hold 10% of their caches: a 3,024-token request leaves them far below
	// half, so the quota holds back.
	for _, a := range local {
		c.ObserveEngineLoad(a, enginemetrics.Load{Running: 2, KVUsage: 0.1, KVTokens: 100_000})
	}
	for key := uint64(2); key < 12; key++ {
		if d := route(c, key); d.Verdict != Steer || !d.QuotaHeld {
			t.Fatalf("engines at 10%% of their caches: verdict %v held %v, want %v and held", d.Verdict, d.QuotaHeld, Steer)
		}
	}
	// Past half of their caches in work, the quota sheds again.
	for _, a := range local {
		c.ObserveEngineLoad(a, enginemetrics.Load{Running: 20, KVUsage: 0.6, KVTokens: 100_000})
	}
	if d := route(c, 12); d.Verdict != ShedQuota {
		t.Fatalf("engines at 60%% of their caches: verdict %v, want %v", d.Verdict, ShedQuota)
	}
	// An engine that holds requests waiting queues them whatever its cache holds (its batch
	// is full of sequences): the quota sheds again, and holds back once the queue is gone.
	for _, a := range local {
		c.ObserveEngineLoad(a, enginemetrics.Load{Running: 2, Waiting: 3, KVUsage: 0.01, KVTokens: 100_000})
	}
	if d := route(c, 13); d.Verdict != ShedQuota {
		t.Fatalf("engines holding requests waiting: verdict %v, want %v", d.Verdict, ShedQuota)
	}
	for _, a := range local {
		c.ObserveEngineLoad(a, enginemetrics.Load{Running: 2, KVUsage: 0.01, KVTokens: 100_000})
	}
	if d := route(c, 14); d.Verdict != Steer {
		t.Fatalf("engines with room and no queue: verdict %v, want %v", d.Verdict, Steer)
	}
	// quota_at 0: the quota takes requests whatever the engines hold.
	c0 := quotaCore(t, 0)
	for _, a := range local {
		c0.ObserveEngineLoad(a, enginemetrics.Load{KVUsage: 0, KVTokens: 100_000})
	}
	if d := route(c0, 1); d.Verdict != ShedQuota {
		t.Fatalf("quota_at 0, idle engines: verdict %v, want %v", d.Verdict, ShedQuota)
	}
	if err := (Config{QuotaAt: -1, Log: slog.New(slog.DiscardHandler)}).Validate(); err == nil {
		t.Error("QuotaAt -1 validated")
	}
}

// The core weighs a request in the shed quota by its work (prompt tokens plus DecodeWork):
// with shed.by_work, the default, a long prompt is refused more often than a short one for
// the same fraction; without it, as often.
func TestQuotaWeighsRequestsByWork(t *testing.T) {
	for _, byWork := range []bool{true, false} {
		c := overflowViewCore(t, func(c *Config) { c.QuotaAt, c.Shed.ByWork = 0, byWork })
		if err := c.ApplyPolicy(&meridianv1.Policy{Version: "v", Shed: []*meridianv1.ModelShed{{Model: "a", Fraction: 0.05}}}); err != nil {
			t.Fatal(err)
		}
		var n, shed [2]int // [0] 1,000-token prompts, [1] 30,000-token ones (a tenth, drawn)
		r := rand.New(rand.NewPCG(3, 4))
		for i := range 4000 {
			k, tokens := 0, 1000
			if r.Float64() < 0.1 {
				k, tokens = 1, 30000
			}
			d := c.Route(Request{Model: "a", Key: uint64(i + 1), BodyBytes: tokens * BytesPerToken}, make([]int, 0, 8))
			n[k]++
			if d.Verdict == ShedQuota {
				shed[k]++
			}
		}
		short, long := float64(shed[0])/float64(n[0]), float64(shed[1])/float64(n[1])
		t.Logf("by_work %v: shed %.3f of the short prompts and %.3f of the long", byWork, short, long)
		if byWork && !(long > 5*short) {
			t.Errorf("by_work: shed %.3f of the long prompts and %.3f of the short, want the long ones far more often", long, short)
		}
		if !byWork && (long > 2*short+0.01 || short > 2*long+0.01) {
			t.Errorf("by requests: shed %.3f of the long prompts and %.3f of the short, want about the same share", long, short)
		}
	}
}
