// Command nullproc is an ext_proc server that decides nothing: it answers every message
// Envoy sends with "continue", as fast as Go's gRPC allows. bench-overhead runs it beside a
// third Envoy to measure what ext_proc itself costs, apart from what the meridian sidecar
// does. It takes the sidecar's flags, so the test stack can start it in the sidecar's place.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	extprocv3filter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meridian-router/meridian/mtls"
)

func main() {
	fs := flag.NewFlagSet("nullproc", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: nullproc --listen ADDR --http-listen ADDR\n\nAn ext_proc server that changes nothing, for overhead baselines.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	listen := fs.String("listen", "127.0.0.1:19001", "gRPC address for Envoy's ext_proc filter")
	httpListen := fs.String("http-listen", "127.0.0.1:19081", "HTTP address for /healthz")
	nodeID := fs.String("node-id", "", "the node whose Envoy may call (with --tls-*)")
	var files mtls.Files
	fs.StringVar(&files.Cert, "tls-cert", "", "the node's sidecar certificate: serve mutual TLS, as the sidecar does")
	fs.StringVar(&files.Key, "tls-key", "", "key of --tls-cert")
	fs.StringVar(&files.CA, "tls-ca", "", "CA bundle")
	for _, name := range []string{"control", "body-limit", "tls-reload"} { // the sidecar's, unused
		fs.String(name, "", "ignored (the meridian sidecar's flag)")
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	var opts []grpc.ServerOption
	if files.Enabled() {
		src, err := mtls.NewSource(files, mtls.Sidecar(*nodeID), slog.Default())
		if err != nil {
			fmt.Fprintln(os.Stderr, "nullproc:", err)
			os.Exit(2)
		}
		envoy := mtls.Envoy(*nodeID)
		opts = append(opts, grpc.Creds(src.ServerCredentials(func(id mtls.Identity) error {
			if id != envoy {
				return fmt.Errorf("%s is not %s", id, envoy)
			}
			return nil
		}, nil)))
	}
	if err := run(*listen, *httpListen, opts); err != nil {
		fmt.Fprintln(os.Stderr, "nullproc:", err)
		os.Exit(1)
	}
}

func run(listen, httpListen string, opts []grpc.ServerOption) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	hl, err := net.Listen("tcp", httpListen)
	if err != nil {
		return err
	}
	// The same server options as the sidecar, so the comparison is of the work alone.
	gs := grpc.NewServer(append(opts, grpc.InitialWindowSize(1<<20), grpc.InitialConnWindowSize(16<<20))...)
	extprocv3.RegisterExternalProcessorServer(gs, null{})
	accesslogv3.RegisterAccessLogServiceServer(gs, drain{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	go func() { _ = (&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(hl) }()
	return gs.Serve(ln)
}

// drain takes Envoy's access log entries and drops them.
type drain struct {
	accesslogv3.UnimplementedAccessLogServiceServer
}

func (drain) StreamAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	for {
		if _, err := stream.Recv(); err != nil {
			return nil
		}
	}
}

type null struct {
	extprocv3.UnimplementedExternalProcessorServer
}

// Process continues every message. Like the sidecar, it holds the headers answer until the
// body has ended when Envoy streams the body without waiting for it (the bench's bodies are
// small, so it need not stop at half the buffer limit).
func (null) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	hold, decided, pending := false, false, 0
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		var out []*extprocv3.ProcessingResponse
		switch r := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			pc := req.GetProtocolConfig()
			hold = pc.GetRequestBodyMode() == extprocv3filter.ProcessingMode_STREAMED && pc.GetSendBodyWithoutWaitingForHeaderResponse() &&
				!r.RequestHeaders.GetEndOfStream()
			if !hold {
				out = append(out, headersContinue())
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			if !hold || decided {
				out = append(out, bodyContinue())
				break
			}
			pending++
			if r.RequestBody.GetEndOfStream() {
				decided = true
				out = append(out, headersContinue())
				for ; pending > 0; pending-- {
					out = append(out, bodyContinue())
				}
			}
		}
		for _, o := range out {
			if err := stream.Send(o); err != nil {
				return err
			}
		}
	}
}

func headersContinue() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
}

func bodyContinue() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
}
