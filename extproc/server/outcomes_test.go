package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/meridian-router/meridian/extproc/guard/guardtest"
	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/xdsclient"
	"github.com/meridian-router/meridian/xdsapi"
)

// A sidecar that steers requests and hears no outcome says so: without Envoy's gRPC access
// log, in-flight counts of streamed requests would only fall at max_request_age.
func TestWarnsWhenOutcomesStop(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	cfg := DefaultConfig(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)))
	clk := guardtest.NewClock()
	s, err := NewWithClock(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	s.Update(&xdsclient.View{Version: "1", Models: map[string]xdsclient.Model{"llama": {Name: "llama", Cluster: xdsapi.ClusterName("llama"),
		Endpoints: []xdsapi.Endpoint{{Engine: "e0", Address: "10.0.0.1:8000", Weight: 1}, {Engine: "e1", Address: "10.0.0.2:8000", Weight: 1}}}}})
	steer := func(n int) (ticket, upstream string) {
		for i := range n {
			st := &streamState{}
			s.handle(context.Background(), st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}}})
			s.handle(context.Background(), st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
				Body: []byte(fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"q%d"}]}`, i)), EndOfStream: true}}})
			ticket = st.ticket
			for _, h := range st.out[len(st.out)-1].GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == xdsapi.HeaderDestination {
					upstream, _, _ = strings.Cut(string(h.GetHeader().GetRawValue()), ",")
				}
			}
		}
		return ticket, upstream
	}
	warned := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "no outcome from Envoy's access log")
	}
	steer(outcomeSilentAfter)
	clk.Advance(outcomeSilence / 2)
	s.checkOutcomes()
	if warned() {
		t.Fatal("warned before the silence lasted long enough")
	}
	clk.Advance(outcomeSilence)
	s.checkOutcomes()
	if !warned() {
		t.Fatalf("no warning after %d steered requests and %v without an outcome", outcomeSilentAfter, 3*outcomeSilence/2)
	}
	mu.Lock()
	logs.Reset()
	mu.Unlock()
	ticket, upstream := steer(1)
	s.OnOutcome(outcome.Record{Ticket: ticket, Upstream: upstream, Status: 200, Attempts: 1})
	clk.Advance(2 * outcomeSilence)
	s.checkOutcomes()
	if warned() {
		t.Fatal("warned although an outcome came and nothing was steered since")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
