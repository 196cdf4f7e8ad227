package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
)

// PrefixHeader is the header the client sets to a hash of the prompt's prefix, which the
// RING_HASH baseline's route hashes on.
const PrefixHeader = "x-prefix-hash"

// baselineEndpoint is one engine in a baseline Envoy's cluster.
type baselineEndpoint struct {
	Address  string // ip:port
	Priority int    // 0 carries traffic; 1 is failover only
}

// baselineBootstrap is a plain Envoy with one static cluster over the engines and Envoy's
// own balancer: lbPolicy LEAST_REQUEST (default choice_count 2) or RING_HASH (default
// minimum_ring_size 1024) with a route hash policy on PrefixHeader. Everything else keeps
// Envoy's defaults, except the route timeout, which is lifted as meridian's route lifts it
// (Envoy's 15 s default would cut long generations).
func baselineBootstrap(node, listen, admin, accessLog, lbPolicy string, eps []baselineEndpoint) (string, error) {
	var b strings.Builder
	split := func(s string) (string, uint16, error) {
		ap, err := netip.ParseAddrPort(s)
		return ap.Addr().String(), ap.Port(), err
	}
	la, lp, err := split(listen)
	if err != nil {
		return "", err
	}
	aa, apt, err := split(admin)
	if err != nil {
		return "", err
	}
	hash := ""
	if lbPolicy == "RING_HASH" {
		hash = "\n                            hash_policy: [{header: {header_name: " + PrefixHeader + "}}]"
	}
	fmt.Fprintf(&b, `node: {id: %q, cluster: benchfleet}
admin:
  address: {socket_address: {address: %s, port_value: %d}}
static_resources:
  listeners:
    - name: http
      address: {socket_address: {address: %s, port_value: %d}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: baseline
                access_log:
                  - name: envoy.access_loggers.file
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
                      path: %s
                      log_format:
                        json_format:
                          start: "%%START_TIME%%"
                          status: "%%RESPONSE_CODE%%"
                          flags: "%%RESPONSE_FLAGS%%"
                          details: "%%RESPONSE_CODE_DETAILS%%"
                          termination: "%%CONNECTION_TERMINATION_DETAILS%%"
                          failure: "%%UPSTREAM_TRANSPORT_FAILURE_REASON%%"
                          upstream_host: "%%UPSTREAM_HOST%%"
                          duration_ms: "%%DURATION%%"
                          ttfb_ms: "%%RESPONSE_DURATION%%"
                stream_idle_timeout: 300s
                request_timeout: 0s
                route_config:
                  name: baseline
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {prefix: "/"}
                          route:
                            cluster: engines
                            timeout: 600s%s
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: engines
      type: STATIC
      connect_timeout: 1s
      lb_policy: %s
      load_assignment:
        cluster_name: engines
        endpoints:
`, node, aa, apt, la, lp, accessLog, hash, lbPolicy)
	for prio := 0; prio <= 1; prio++ {
		first := true
		for _, ep := range eps {
			if ep.Priority != prio {
				continue
			}
			if first {
				fmt.Fprintf(&b, "          - priority: %d\n            lb_endpoints:\n", prio)
				first = false
			}
			host, port, err := split(ep.Address)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&b, "              - endpoint: {address: {socket_address: {address: %s, port_value: %d}}}\n", host, port)
		}
	}
	return b.String(), nil
}

// baselineNode is one region's plain Envoy for one baseline configuration. Its ports are
// chosen when it starts, not when it is prepared: a port found free minutes before the
// Envoy binds it may meanwhile go to another process of the bench.
type baselineNode struct {
	URL, AdminURL string
	Envoy         *stack.Proc

	dir, envoyBin, name, lbPolicy string
	eps                           []baselineEndpoint
	ports                         *stack.Ports
}

// newBaselineNode prepares (does not start) the Envoy.
func newBaselineNode(dir, envoyBin, config, region, lbPolicy string, eps []baselineEndpoint, ports *stack.Ports) *baselineNode {
	return &baselineNode{dir: dir, envoyBin: envoyBin, name: config + "-" + region, lbPolicy: lbPolicy, eps: eps, ports: ports}
}

// configure picks the node's ports and writes its bootstrap.
func (n *baselineNode) configure() error {
	listen, err := n.ports.Addr()
	if err != nil {
		return err
	}
	admin, err := n.ports.Addr()
	if err != nil {
		return err
	}
	yaml, err := baselineBootstrap(n.name, listen, admin, filepath.Join(n.dir, "access-"+n.name+".jsonl"), n.lbPolicy, n.eps)
	if err != nil {
		return fmt.Errorf("bootstrap for %s: %w", n.name, err)
	}
	path := filepath.Join(n.dir, "envoy-"+n.name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		return err
	}
	n.URL, n.AdminURL = "http://"+listen, "http://"+admin
	n.Envoy = &stack.Proc{Name: "envoy-" + n.name, Bin: n.envoyBin, Log: filepath.Join(n.dir, "envoy-"+n.name+".log"),
		Args: []string{"-c", path, "--disable-hot-restart", "--concurrency", "1", "--log-level", "warn"}}
	return nil
}

// start picks the ports, runs the Envoy and waits until it is ready and its listener
// accepts connections (Envoy's /ready can answer before the worker listens), failing at
// once if it exits.
func (n *baselineNode) start(ctx context.Context) error {
	if err := n.configure(); err != nil {
		return err
	}
	if err := n.Envoy.Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	listen := strings.TrimPrefix(n.URL, "http://")
	for {
		try, stop := context.WithTimeout(ctx, time.Second)
		err := stack.WaitHTTP(try, n.AdminURL+"/ready", 200)
		if err == nil {
			var c net.Conn
			if c, err = (&net.Dialer{}).DialContext(try, "tcp", listen); err == nil {
				c.Close()
				stop()
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		stop()
		if !n.Envoy.Running() || ctx.Err() != nil {
			n.Envoy.Stop(time.Second)
			return fmt.Errorf("%s did not become ready (see %s): %w", n.Envoy.Name, n.Envoy.Log, err)
		}
	}
}
