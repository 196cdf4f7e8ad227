package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3filter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/meridian-router/meridian/extproc/outcome"
	"github.com/meridian-router/meridian/extproc/xdsclient"
	"github.com/meridian-router/meridian/xdsapi"
)

// chat8K is an 8 KB chat body: a system prompt and a few turns, as a client would send.
func chat8K(tb testing.TB) []byte {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("You are a careful assistant. Answer briefly. ", 40)}}
	for i := 0; len(msgs) < 12; i++ {
		msgs = append(msgs, map[string]string{"role": "user", "content": strings.Repeat(fmt.Sprintf("Question %d about the \"data\" set.\n", i), 16)})
		msgs = append(msgs, map[string]string{"role": "assistant", "content": strings.Repeat("An answer with some detail. ", 12)})
	}
	b, err := json.Marshal(map[string]any{"model": "llama", "stream": true, "max_tokens": 256, "messages": msgs})
	if err != nil {
		tb.Fatal(err)
	}
	for len(b) < 8<<10 { // pad the last message to reach 8 KB
		msgs[len(msgs)-1]["content"] += " more"
		b, _ = json.Marshal(map[string]any{"model": "llama", "stream": true, "max_tokens": 256, "messages": msgs})
	}
	return b
}

func benchServer(tb testing.TB, engines int) *Server {
	s, err := New(DefaultConfig(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		tb.Fatal(err)
	}
	eps := make([]xdsapi.Endpoint, engines)
	for i := range eps {
		eps[i] = xdsapi.Endpoint{Engine: fmt.Sprintf("e%d", i), Address: fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1), Weight: uint32(100 + i%7)}
	}
	s.Update(&xdsclient.View{Version: "1", Models: map[string]xdsclient.Model{
		"llama": {Name: "llama", Cluster: xdsapi.ClusterName("llama"), Endpoints: eps},
	}})
	return s
}

// BenchmarkProcess is the sidecar's whole handling of one request: the headers message,
// the body message (parse an 8 KB chat body, hash the prefix, pick, build the answer),
// and the outcome from Envoy's access log that ends the request's ticket. The body comes
// streamed with the headers held, as the bootstrap configures Envoy.
func BenchmarkProcess(b *testing.B) {
	for _, n := range []int{16, 256} {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			s := benchServer(b, n)
			body := chat8K(b)
			ctx := context.Background()
			hdrs := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					{Key: ":path", RawValue: []byte("/v1/chat/completions")}, {Key: ":method", RawValue: []byte("POST")},
					{Key: "content-type", RawValue: []byte("application/json")},
				}}}},
				ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocv3filter.ProcessingMode_STREAMED, SendBodyWithoutWaitingForHeaderResponse: true}}
			bodyReq := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var st streamState
				s.handle(ctx, &st, hdrs)
				s.handle(ctx, &st, bodyReq)
				if len(st.out) != 2 {
					b.Fatalf("%d answers, want the headers' and the body's", len(st.out))
				}
				var ticket, dest string
				for _, h := range st.out[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
					switch h.GetHeader().GetKey() {
					case outcome.HeaderTicket:
						ticket = string(h.GetHeader().GetRawValue())
					case xdsapi.HeaderDestination:
						dest = string(h.GetHeader().GetRawValue())
					}
				}
				first, _, _ := strings.Cut(dest, ",")
				s.OnOutcome(outcome.Record{Ticket: ticket, Upstream: first, Status: 200, Attempts: 1})
			}
		})
	}
}
