package server_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/meridian-router/meridian/extproc/server"
)

// want413 checks r is an immediate 413 in OpenAI's error shape.
func want413(t *testing.T, r *extprocv3.ProcessingResponse) {
	t.Helper()
	ir := r.GetImmediateResponse()
	if ir == nil || ir.GetStatus().GetCode() != 413 {
		t.Fatalf("answer %v, want an immediate 413", r)
	}
	var doc struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Param   *string
			Code    any `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &doc); err != nil || doc.Error.Message == "" || doc.Error.Type != "invalid_request_error" {
		t.Fatalf("413 body %q (%v), want OpenAI's error shape", ir.GetBody(), err)
	}
}

// TestTrustBodyOverItsModelsLimitIs413: a Content-Length over the model's limit is refused
// with 413 before the headers are answered (so Envoy never contacts an engine), a model's
// own limit overrides the default, and a body under the limit is routed.
func TestTrustBodyOverItsModelsLimitIs413(t *testing.T) {
	h := newHarnessWith(t, func(c *server.Config) {
		c.MaxRequest = server.RequestLimits{DefaultBytes: 1 << 20, Models: map[string]int64{"llama": 4 << 10}}
	})
	body := modelFirst("llama", strings.Repeat("x", 8<<10))
	s := h.streamed(t, "/v1/chat/completions", map[string]string{"content-length": strconv.Itoa(len(body))})
	s.chunk(body[:2<<10], false)
	want413(t, s.recv())

	small := modelFirst("llama", "hi")
	s = h.streamed(t, "/v1/chat/completions", map[string]string{"content-length": strconv.Itoa(len(small))})
	s.chunk(small, true)
	if r := s.recv(); r.GetRequestHeaders() == nil {
		t.Fatalf("a body under the limit: %v, want it routed", r)
	}
}

// TestTrustStreamedBodyWithoutLengthIsCutAtItsLimit: a body without a Content-Length is
// routed once its key is in, and answered 413 as soon as what follows passes the limit.
func TestTrustStreamedBodyWithoutLengthIsCutAtItsLimit(t *testing.T) {
	h := newHarnessWith(t, func(c *server.Config) {
		c.MaxRequest = server.RequestLimits{DefaultBytes: 64 << 10}
		c.BodyLimitBytes = 32 << 10
		c.HoldTimeout = time.Minute
	})
	body := modelFirst("llama", strings.Repeat("a long document ", 8<<10)) // 128 KiB
	s := h.streamed(t, "/v1/chat/completions", nil)
	s.chunk(body[:20<<10], false) // past half the buffer limit: routed
	if r := s.recv(); r.GetRequestHeaders() == nil {
		t.Fatalf("first answer %v, want the routed headers", r)
	}
	s.expectBodies(1)
	s.chunk(body[20<<10:60<<10], false) // 60 KiB: still under
	s.expectBodies(1)
	s.chunk(body[60<<10:80<<10], false) // 80 KiB: over
	want413(t, s.recv())
}
