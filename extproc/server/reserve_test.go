package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/meridian-router/meridian/extproc/xdsclient"
	"github.com/meridian-router/meridian/xdsapi"
)

// As capped engines fill up, the lowest priority meets its local limit first and the
// highest keeps being admitted until every slot is taken.
func TestLocalLimitShedsLowPriorityFirst(t *testing.T) {
	s, err := New(DefaultConfig(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	eps := []xdsapi.Endpoint{
		{Engine: "e0", Address: "127.0.0.1:8001", Weight: 1, MaxInFlight: 10},
		{Engine: "e1", Address: "127.0.0.1:8002", Weight: 1, MaxInFlight: 10},
		{Engine: "e2", Address: "127.0.0.1:8003", Weight: 1, MaxInFlight: 10},
	}
	s.Update(&xdsclient.View{Version: "1", Models: map[string]xdsclient.Model{
		"llama": {Name: "llama", Cluster: xdsapi.ClusterName("llama"), Endpoints: eps}}})
	send := func(i, priority int) bool {
		var st streamState
		hdrs := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":path", RawValue: []byte("/v1/chat/completions")},
				{Key: "x-meridian-priority", RawValue: []byte(fmt.Sprint(priority))},
			}}}}}
		body := fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"request %d"}]}`, i)
		s.handle(context.Background(), &st, hdrs)
		s.handle(context.Background(), &st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
		return st.out[len(st.out)-1].GetImmediateResponse() == nil // admitted; its ticket stays in flight
	}
	firstLowShed, highAdmitted := -1, 0
	for i := 0; i < 80; i++ {
		if !send(i, 0) && firstLowShed < 0 {
			firstLowShed = i
		}
		if send(1000+i, 3) {
			highAdmitted++
		}
	}
	if firstLowShed < 0 {
		t.Fatal("priority 0 was never shed")
	}
	// Requests alternate, so the low class had half of the first 2×firstLowShed slots: it
	// must stop at the 80% of the caps it may use, not at the caps.
	if 2*firstLowShed > 25 {
		t.Fatalf("priority 0 was admitted %d times of 30 slots: it may use only 80%%", firstLowShed)
	}
	if s.core.InFlightTotal() != 30 || highAdmitted != 30-firstLowShed {
		t.Fatalf("in flight %d, high-priority admitted %d: the top class must fill every slot the low one left", s.core.InFlightTotal(), highAdmitted)
	}
	t.Logf("priority 0 shed from its request %d on; priority 3 admitted %d times; %d in flight", firstLowShed, highAdmitted, s.core.InFlightTotal())
}
