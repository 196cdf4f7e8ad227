package server

import (
	"bytes"
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

// benchRequest is one request's messages: the headers (the body streamed behind them, as
// the bootstrap configures Envoy) and an 8 KB chat body.
func benchRequest(b *testing.B) (hdrs, body *extprocv3.ProcessingRequest) {
	chat := chat8K(b)
	b.SetBytes(int64(len(chat)))
	hdrs = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte("/v1/chat/completions")}, {Key: ":method", RawValue: []byte("POST")},
			{Key: "content-type", RawValue: []byte("application/json")},
		}}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocv3filter.ProcessingMode_STREAMED, SendBodyWithoutWaitingForHeaderResponse: true}}
	body = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: chat, EndOfStream: true}}}
	return hdrs, body
}

// processOne is the sidecar's whole handling of one request: the headers message, the body
// message (parse, hash the prefix, pick, build the answer), and the outcome from Envoy's
// access log that ends the request's ticket.
func processOne(b *testing.B, s *Server, st *streamState, hdrs, body *extprocv3.ProcessingRequest) {
	ctx := context.Background()
	*st = streamState{}
	s.handle(ctx, st, hdrs)
	s.handle(ctx, st, body)
	if len(st.out) != 2 {
		b.Fatalf("%d answers, want the headers' and the body's", len(st.out))
	}
	var first []byte
	for _, h := range st.out[0].GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == xdsapi.HeaderDestination {
			first = h.GetHeader().GetRawValue()
		}
	}
	if i := bytes.IndexByte(first, ','); i >= 0 {
		first = first[:i]
	}
	s.OnOutcome(outcome.Record{Ticket: st.ticket, Upstream: string(first), Status: 200, Attempts: 1})
}

// BenchmarkProcess is one request at a time (processOne).
func BenchmarkProcess(b *testing.B) {
	for _, n := range []int{16, 256} {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			s := benchServer(b, n)
			hdrs, body := benchRequest(b)
			b.ReportAllocs()
			b.ResetTimer()
			var st streamState
			for i := 0; i < b.N; i++ {
				processOne(b, s, &st, hdrs, body)
			}
		})
	}
}

// BenchmarkProcessParallel is processOne from GOMAXPROCS goroutines at once, as Envoy's
// concurrent streams arrive: it shows the request path's contention.
func BenchmarkProcessParallel(b *testing.B) {
	for _, n := range []int{16, 256} {
		b.Run(fmt.Sprintf("engines=%d", n), func(b *testing.B) {
			s := benchServer(b, n)
			hdrs, body := benchRequest(b)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var st streamState
				for pb.Next() {
					processOne(b, s, &st, hdrs, body)
				}
			})
		})
	}
}
