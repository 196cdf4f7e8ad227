package server

import (
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// reportRefusalLogEvery bounds how often a refused report stream is logged.
const reportRefusalLogEvery = 30 * time.Second

// logReportEnd logs why a load-report stream ended: a refusal by the control server (this
// sidecar's certificate or node id is wrong, the fleet lacks the node) is an error an
// operator must fix, logged at most every reportRefusalLogEvery (last holds when it was);
// anything else is a reconnect, logged at debug.
func logReportEnd(log *slog.Logger, err error, backoff time.Duration, last *time.Time) {
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated, codes.NotFound, codes.InvalidArgument, codes.ResourceExhausted:
		if time.Since(*last) >= reportRefusalLogEvery {
			*last = time.Now()
			log.Error("the control server refuses this sidecar's load reports: its demand and engine view do not count until fixed", "err", err)
		}
	default:
		log.Debug("load report stream ended; reconnecting", "err", err, "in", backoff)
	}
}
