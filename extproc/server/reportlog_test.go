package server

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A refused report stream is an error in the log, once per 30 s; a reconnect is not.
func TestTrustRefusedReportsAreLoggedOnce(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var last time.Time
	refused := status.Error(codes.PermissionDenied, "spiffe://meridian/node/b/sidecar may report only for node \"b\"")
	logReportEnd(log, refused, time.Second, &last)
	logReportEnd(log, refused, time.Second, &last)
	logReportEnd(log, errors.New("connection reset"), time.Second, &last)
	if n := strings.Count(buf.String(), "level=ERROR"); n != 1 || !strings.Contains(buf.String(), "may report only for node") {
		t.Fatalf("log %q: want the refusal once, at ERROR", buf.String())
	}
}
