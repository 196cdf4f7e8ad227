package server_test

import (
	"fmt"
	"strconv"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/meridian-router/meridian/extproc/server"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
	"github.com/meridian-router/meridian/xdsapi"
)

func decisionOf(r *extprocv3.ProcessingResponse) map[string]any {
	return r.GetDynamicMetadata().GetFields()[xdsapi.MetadataNamespaceDecision].GetStructValue().AsMap()
}

// Every answer that decides carries the decision for Envoy's access log: where a steered
// request goes (the same list and key as its headers), and why a shed one was refused.
func TestAnswersCarryTheDecisionForTheAccessLog(t *testing.T) {
	h := newHarnessWith(t, func(c *server.Config) { c.SheddableBelow = 1 })
	r := h.exchange(t, "/v1/chat/completions", chatBody("llama", "logged"))
	d := decisionOf(r)
	if d["result"] != "steered" || d["model"] != "llama" || d["engines"] != header(r, xdsapi.HeaderDestination) ||
		d["prefix_key"] != header(r, xdsapi.HeaderPrefixHash) || d["retries"] != mustFloat(t, header(r, "x-envoy-max-retries")) ||
		d["retry_on"] != header(r, "x-envoy-retry-on") || d["passed_over_for_load"] != false || d["overflowed"] != false {
		t.Fatalf("steered decision %v does not match its answer's headers", d)
	}
	if _, ok := d["status"]; ok {
		t.Fatalf("steered decision %v has a status", d)
	}

	h.srv.ApplyPolicy(&meridianv1.Policy{Version: "v", Shed: []*meridianv1.ModelShed{{Model: "llama", Fraction: 0.5}}})
	for i := 0; i < 200; i++ {
		r := h.exchangeWith(t, "/v1/chat/completions", chatBody("llama", fmt.Sprintf("s%d", i)), map[string]string{"x-meridian-priority": "0"})
		if r.GetImmediateResponse() == nil {
			continue
		}
		d := decisionOf(r)
		if d["result"] != "shed_quota" || d["status"] != float64(429) || d["priority"] != float64(0) || d["engines"] != nil {
			t.Fatalf("shed decision %v, want shed_quota with status 429 at priority 0 and no engines", d)
		}
		return
	}
	t.Fatal("nothing shed at a shed fraction of 0.5")
}

func mustFloat(t *testing.T, s string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
