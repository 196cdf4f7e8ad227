package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// ClientRegionHeader is the request header that names the data-plane node a request
// entered through, for RegionDelay. The client sets it; Envoy forwards it unchanged.
const ClientRegionHeader = "x-client-region"

// RTTFunc returns the round trip between a data-plane node and an engine region.
type RTTFunc func(node, engineRegion string) time.Duration

// RegionDelay emulates inter-region network latency without kernel support: every
// engine sits behind an HTTP front on its fleet address that holds each request for the
// round trip between the node named in ClientRegionHeader and the engine's region, then
// forwards it (streaming, unbuffered) to the engine on a private port. Time to first
// token and end-to-end latency grow by the round trip, as on a real network; requests
// without the header (metrics scrapes, /admin calls) pass at once.
type RegionDelay struct {
	servers []*http.Server
	wg      sync.WaitGroup
}

// DelayByRegion moves every engine of s behind a delaying front. It restarts each
// engine on a new private port (a later --listen flag overrides the first), so call it
// before traffic starts. Close stops the fronts; Stack.Close still stops the engines.
func (s *Stack) DelayByRegion(ctx context.Context, rtt RTTFunc) (*RegionDelay, error) {
	if rtt == nil {
		return nil, errors.New("stack: DelayByRegion needs an RTT function")
	}
	d := &RegionDelay{}
	for _, spec := range s.spec.Engines {
		e := s.Engines[spec.Name]
		if err := d.front(ctx, e, spec.Region, rtt, &s.ports); err != nil {
			d.Close()
			return nil, fmt.Errorf("engine %s: %w", e.Name, err)
		}
	}
	return d, nil
}

func (d *RegionDelay) front(ctx context.Context, e *Engine, region string, rtt RTTFunc, ports *Ports) error {
	innerAddr, err := ports.Addr()
	if err != nil {
		return err
	}
	e.Proc.Stop(2 * time.Second)
	e.Proc.Args = append(e.Proc.Args, "--listen", innerAddr)
	if err := e.Proc.Start(); err != nil {
		return err
	}
	if err := WaitHTTP(ctx, "http://"+innerAddr+"/health", http.StatusOK); err != nil {
		return err
	}
	ln, err := listenRetry(ctx, e.Address)
	if err != nil {
		return err
	}
	target := &url.URL{Scheme: "http", Host: innerAddr}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target); r.Out.Host = r.In.Host },
		FlushInterval: -1, // SSE: every chunk goes out as it comes
		Transport:     &http.Transport{Proxy: nil, MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: 90 * time.Second},
		// The default handler logs every error, among them the requests their client
		// cancelled (a load loop's deadline, the stack stopping): those are no fault.
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if !errors.Is(err, context.Canceled) {
				slog.Warn("region delay: proxy to the engine failed", "engine", innerAddr, "err", err)
			}
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if from := r.Header.Get(ClientRegionHeader); from != "" {
			t := time.NewTimer(rtt(from, region))
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		// Full duplex: without it Go's HTTP/1 server, once the engine's response headers go
		// out, drains whatever of the request body the proxy has not yet read, racing the
		// copy to the engine; the proxy then aborts a response already under way.
		_ = http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	d.servers = append(d.servers, srv)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		_ = srv.Serve(ln)
	}()
	return WaitHTTP(ctx, "http://"+e.Address+"/health", http.StatusOK)
}

// listenRetry listens on addr, retrying briefly while the engine that held it lets go.
func listenRetry(ctx context.Context, addr string) (net.Listener, error) {
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("listen on %s: %w", addr, errors.Join(err, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close stops the fronts and waits for them; requests in flight are cut.
func (d *RegionDelay) Close() {
	for _, s := range d.servers {
		_ = s.Close()
	}
	d.wg.Wait()
}
