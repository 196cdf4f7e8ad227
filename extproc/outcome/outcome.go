package outcome

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Custom tags the bootstrap asks Envoy to log (durations in microseconds).
const (
	TagTTFT   = "meridian.ttft_us"
	TagDecode = "meridian.decode_us"
)

// micros parses a logged duration; "-" or garbage is unknown (0).
func micros(s string) time.Duration {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Microsecond
}

// HeaderTicket carries the sidecar's ticket id on the request, for Envoy to log back.
const HeaderTicket = "x-meridian-ticket"

// Record is one completed request as Envoy saw it.
type Record struct {
	Ticket string
	// RequestID is Envoy's x-request-id, logged even when the sidecar's headers were not
	// applied (Envoy stopped waiting for it), which Ticket then is not.
	RequestID string
	Upstream  string // ip:port of the last engine tried; "" when none was reached
	Status    int    // HTTP status sent downstream (0 if none)
	TTFB      time.Duration
	// TTFT is the time from sending the request upstream to the first response body byte
	// (the first token of a stream); 0 when unknown.
	TTFT time.Duration
	// Decode is the time from the first to the last response body byte, and BodyBytes the
	// body's size: together a per-engine decode speed, comparable between engines of one
	// model because their chunks have the same shape.
	Decode    time.Duration
	BodyBytes uint64
	Duration  time.Duration
	Attempts  int
	// UpstreamFailure is set when Envoy could not get a response from an engine (connect
	// failure, reset, timeout), as opposed to an engine answering with an error.
	UpstreamFailure bool
}

// Receiver serves envoy.service.accesslog.v3.AccessLogService.
type Receiver struct {
	accesslogv3.UnimplementedAccessLogServiceServer
	handle func(Record)
	log    *slog.Logger
}

// NewReceiver returns a receiver that calls handle for every HTTP entry, from the gRPC
// stream's goroutine: handle must not block for long.
func NewReceiver(handle func(Record), log *slog.Logger) *Receiver {
	return &Receiver{handle: handle, log: log}
}

// StreamAccessLogs reads one Envoy's log stream until it ends.
func (r *Receiver) StreamAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return stream.SendAndClose(&accesslogv3.StreamAccessLogsResponse{})
		}
		if err != nil {
			return err
		}
		for _, e := range msg.GetHttpLogs().GetLogEntry() {
			r.handle(FromEntry(e))
		}
	}
}

// FromEntry converts one HTTP access log entry.
func FromEntry(e *accesslogdatav3.HTTPAccessLogEntry) Record {
	c := e.GetCommonProperties()
	rec := Record{
		Ticket:    e.GetRequest().GetRequestHeaders()[HeaderTicket],
		RequestID: e.GetRequest().GetRequestId(),
		Status:    int(e.GetResponse().GetResponseCode().GetValue()),
		TTFB:      c.GetTimeToFirstUpstreamRxByte().AsDuration(),
		Duration:  c.GetTimeToLastDownstreamTxByte().AsDuration(),
		Attempts:  int(c.GetUpstreamRequestAttemptCount()),
	}
	if d := c.GetDuration(); d != nil {
		rec.Duration = d.AsDuration()
	}
	rec.TTFT = micros(c.GetCustomTags()[TagTTFT])
	rec.Decode = micros(c.GetCustomTags()[TagDecode])
	rec.BodyBytes = e.GetResponse().GetResponseBodyBytes()
	if sa := c.GetUpstreamRemoteAddress().GetSocketAddress(); sa != nil {
		rec.Upstream = net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10))
	}
	f := c.GetResponseFlags()
	rec.UpstreamFailure = f.GetUpstreamConnectionFailure() || f.GetUpstreamConnectionTermination() ||
		f.GetUpstreamRemoteReset() || f.GetUpstreamRequestTimeout() || f.GetUpstreamOverflow() ||
		f.GetNoHealthyUpstream() || f.GetUpstreamRetryLimitExceeded()
	return rec
}
