package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/meridian-router/meridian/bootstrap"
	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/mtls"
	"github.com/meridian-router/meridian/xdsapi"
)

// NodeSpec is one data-plane node: an Envoy and its sidecar.
type NodeSpec struct {
	Name, Region string
	// WithoutSidecar runs a plain Envoy (no ext_proc), for baselines.
	WithoutSidecar bool
	// SidecarBin, when set, runs this binary as the node's ext_proc server instead of the
	// meridian sidecar (it gets the same flags), for baselines.
	SidecarBin string
}

// EngineSpec is one mock engine.
type EngineSpec struct {
	Name, Region string
	Models       []string
	CapacityRPS  float64
	// PrefillShare is the fleet file's prefill_share for the engine (0: none).
	PrefillShare float64
	// MaxInFlight is the fleet file's hard cap for the sidecar (0: none).
	MaxInFlight int
	// Args are extra engine flags (mockvllm's, for example --ttft, or llm-d-inference-sim's).
	Args []string
	// LLMDSim runs llm-d-inference-sim (Binaries.LLMDSim) instead of the mock: an engine
	// meridian did not write. It serves exactly one model, and has no /admin/faults.
	LLMDSim bool
}

// Spec describes a stack.
type Spec struct {
	Dir     string // logs, fleet file and bootstraps go here
	Bins    Binaries
	Nodes   []NodeSpec
	Engines []EngineSpec
	// RTTMillis[node][region]; when nil, 1 ms within a region and 40 ms across.
	RTTMillis map[string]map[string]float64
	// Weights are static EDS weights per node and engine (the fleet file's weights section).
	Weights map[string]map[string]uint32
	// EnvoyConcurrency is Envoy's worker count (default 1: tests share two cores).
	EnvoyConcurrency int
	SidecarArgs      []string
	ControlArgs      []string
	// ControlHost, when set, is the host name the nodes (Envoy's bootstrap and the
	// sidecars) reach the control server by, instead of its IP: it must resolve to
	// 127.0.0.1 ("localhost").
	ControlHost string
	Bootstrap   func(*bootstrap.Params) // optional edits to each node's bootstrap
	// BootstrapYAML, when set, rewrites each node's rendered bootstrap before Envoy starts
	// (for Envoy shapes the template does not offer, such as a GIE gateway's).
	// It gets the stack being started, whose Engines have their addresses.
	BootstrapYAML func(s *Stack, node string, yaml []byte) ([]byte, error)
	// Plaintext runs every connection meridian owns without TLS (allowed on loopback).
	// By default a stack runs mutual TLS everywhere, with a throwaway CA (Stack.PKI).
	Plaintext bool
}

// Stack is a running system.
type Stack struct {
	spec        Spec
	FleetPath   string
	Control     *Proc
	ControlXDS  string // ip:port
	ControlHTTP string // http://ip:port
	Nodes       map[string]*Node
	Engines     map[string]*Engine
	// peers are the sidecars StartPeerSidecar added.
	peers []*Proc
	// PKI issued every certificate; nil for a Plaintext stack.
	PKI *PKI
	// ports hands out every port the stack listens on, each once.
	ports Ports
}

// Node is one running data-plane node.
type Node struct {
	Name        string
	URL         string // http://ip:port of Envoy's listener
	AdminURL    string
	SidecarHTTP string
	SidecarGRPC string // ip:port of the sidecar's ext_proc and access-log server
	// SidecarPeer is ip:port of the sidecar's peer exchange (--peer-listen), which a
	// peer sidecar of the node watches (StartPeerSidecar); empty with SidecarBin.
	SidecarPeer string
	AccessLog   string
	Envoy       *Proc
	Sidecar     *Proc
}

// Engine is one running mock engine.
type Engine struct {
	Name    string
	Address string // ip:port
	Proc    *Proc
}

// Start brings up the whole stack and waits until every Envoy routes to its engines.
// On error everything already started is stopped.
func Start(ctx context.Context, spec Spec) (*Stack, error) {
	// Free ports are picked, released and then bound by the child: another process can take
	// one in between (tests run in parallel). A child that exits while starting gets the
	// whole stack started again on fresh ports.
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var s *Stack
		if s, err = start(ctx, spec); err == nil || !errors.Is(err, errExited) || ctx.Err() != nil {
			return s, err
		}
	}
	return nil, err
}

// errExited reports a child process that exited while the stack waited for it.
var errExited = errors.New("process exited while starting")

// waitUp polls url until it answers want, failing at once if p has exited.
func waitUp(ctx context.Context, p *Proc, url string, want int) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if !p.Running() {
					cancel(fmt.Errorf("%s: %w (see %s)", p.Name, errExited, p.Log))
					return
				}
			}
		}
	}()
	err := WaitHTTP(ctx, url, want)
	if cause := context.Cause(ctx); cause != nil && errors.Is(cause, errExited) {
		return cause
	}
	return err
}

func start(ctx context.Context, spec Spec) (_ *Stack, err error) {
	if len(spec.Nodes) == 0 || len(spec.Engines) == 0 {
		return nil, errors.New("stack: at least one node and one engine are required")
	}
	if spec.EnvoyConcurrency == 0 {
		spec.EnvoyConcurrency = 1
	}
	s := &Stack{spec: spec, FleetPath: filepath.Join(spec.Dir, "fleet.yaml"), Nodes: map[string]*Node{}, Engines: map[string]*Engine{}}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	port := s.ports.Addr
	for _, e := range spec.Engines {
		addr, err := port()
		if err != nil {
			return nil, err
		}
		p, err := s.engineProc(e, addr)
		if err != nil {
			return nil, err
		}
		s.Engines[e.Name] = &Engine{Name: e.Name, Address: addr, Proc: p}
	}
	if err := s.WriteFleet(spec.Weights); err != nil {
		return nil, err
	}
	for _, e := range s.Engines {
		if err := e.Proc.Start(); err != nil {
			return nil, err
		}
	}
	if !spec.Plaintext {
		if s.PKI, err = newPKI(filepath.Join(spec.Dir, "pki"), spec.Nodes); err != nil {
			return nil, err
		}
	}
	if s.ControlXDS, err = port(); err != nil {
		return nil, err
	}
	ctlHTTP, err := port()
	if err != nil {
		return nil, err
	}
	s.ControlHTTP = "http://" + ctlHTTP
	s.Control = s.proc("control", spec.Bins.Control, append([]string{"--fleet", s.FleetPath,
		"--xds-listen", s.ControlXDS, "--http-listen", ctlHTTP, "--poll-interval", "100ms"}, append(s.tlsArgs(mtls.Control()), spec.ControlArgs...)...))
	if err := s.Control.Start(); err != nil {
		return nil, err
	}
	for _, n := range spec.Nodes {
		node, err := s.startNode(n, port)
		if err != nil {
			return nil, err
		}
		s.Nodes[n.Name] = node
	}
	for _, e := range s.Engines {
		if err := waitUp(ctx, e.Proc, "http://"+e.Address+"/health", 200); err != nil {
			return nil, fmt.Errorf("engine %s: %w", e.Name, err)
		}
	}
	if err := waitUp(ctx, s.Control, s.ControlHTTP+"/healthz", 200); err != nil {
		return nil, fmt.Errorf("control server: %w", err)
	}
	for _, n := range s.Nodes {
		if err := s.WaitNodeReady(ctx, n.Name); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// engineProc is the process of engine e listening on addr: the mock, or llm-d-inference-sim.
func (s *Stack) engineProc(e EngineSpec, addr string) (*Proc, error) {
	if !e.LLMDSim {
		args := append([]string{"--listen", addr, "--name", e.Name, "--model", joinModels(e.Models)}, e.Args...)
		return s.proc("engine-"+e.Name, s.spec.Bins.MockEngine, args), nil
	}
	if s.spec.Bins.LLMDSim == "" {
		return nil, fmt.Errorf("engine %s: Binaries.LLMDSim is not set (scripts/llmd-sim.sh builds it)", e.Name)
	}
	if len(e.Models) != 1 {
		return nil, fmt.Errorf("engine %s: llm-d-inference-sim serves one model, got %v", e.Name, e.Models)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	// It has no tokenizer without cgo (--force-dummy-tokenizer), and its KV-cache code needs
	// POD_IP. It binds every interface of the port (0.0.0.0): its listen address is not a flag.
	args := append([]string{"--port", port, "--model", e.Models[0], "--force-dummy-tokenizer"}, e.Args...)
	p := s.proc("engine-"+e.Name, s.spec.Bins.LLMDSim, args)
	p.Env = []string{"POD_IP=127.0.0.1"}
	return p, nil
}

func (s *Stack) proc(name, bin string, args []string) *Proc {
	return &Proc{Name: name, Bin: bin, Args: args, Log: filepath.Join(s.spec.Dir, name+".log")}
}

func (s *Stack) startNode(n NodeSpec, port func() (string, error)) (*Node, error) {
	listen, err := port()
	if err != nil {
		return nil, err
	}
	admin, err := port()
	if err != nil {
		return nil, err
	}
	sidecar, err := port()
	if err != nil {
		return nil, err
	}
	sidecarHTTP, err := port()
	if err != nil {
		return nil, err
	}
	node := &Node{Name: n.Name, URL: "http://" + listen, AdminURL: "http://" + admin, SidecarHTTP: "http://" + sidecarHTTP, SidecarGRPC: sidecar,
		AccessLog: filepath.Join(s.spec.Dir, "access-"+n.Name+".jsonl")}
	p := bootstrap.DefaultParams()
	control := s.controlAddr()
	p.NodeID, p.Listen, p.Admin, p.XDS, p.Sidecar, p.AccessLogPath = n.Name, listen, admin, control, sidecar, node.AccessLog
	p.WithoutSidecar = n.WithoutSidecar
	if s.PKI != nil {
		f := s.PKI.Files(mtls.Envoy(n.Name))
		p.TLS = &bootstrap.TLSFiles{Cert: f.Cert, Key: f.Key, CA: f.CA}
	}
	if s.spec.Bootstrap != nil {
		s.spec.Bootstrap(&p)
	}
	if p.TLS != nil {
		if err := bootstrap.WriteSDS(p); err != nil {
			return nil, fmt.Errorf("bootstrap for %s: %w", n.Name, err)
		}
	}
	bpath := filepath.Join(s.spec.Dir, "envoy-"+n.Name+".yaml")
	var buf bytes.Buffer
	if err := bootstrap.Render(&buf, p); err != nil {
		return nil, fmt.Errorf("bootstrap for %s: %w", n.Name, err)
	}
	out := buf.Bytes()
	if s.spec.BootstrapYAML != nil {
		if out, err = s.spec.BootstrapYAML(s, n.Name, out); err != nil {
			return nil, fmt.Errorf("bootstrap for %s: %w", n.Name, err)
		}
	}
	if err := os.WriteFile(bpath, out, 0o644); err != nil {
		return nil, err
	}
	bin := s.spec.Bins.Sidecar
	args := []string{"--node-id", n.Name, "--listen", sidecar, "--http-listen", sidecarHTTP, "--control", control,
		"--body-limit", strconv.FormatUint(uint64(p.BufferLimitBytes), 10)}
	if n.SidecarBin != "" {
		bin = n.SidecarBin
	} else {
		if node.SidecarPeer, err = port(); err != nil {
			return nil, err
		}
		args = append(args, "--peer-listen", node.SidecarPeer)
	}
	node.Sidecar = s.proc("sidecar-"+n.Name, bin, append(args, append(s.tlsArgs(mtls.Sidecar(n.Name)), s.spec.SidecarArgs...)...))
	node.Envoy = s.proc("envoy-"+n.Name, s.spec.Bins.Envoy, []string{"-c", bpath, "--disable-hot-restart",
		"--concurrency", strconv.Itoa(s.spec.EnvoyConcurrency), "--log-level", "warn", "--file-flush-interval-msec", "50"})
	if !n.WithoutSidecar {
		if err := node.Sidecar.Start(); err != nil {
			return nil, err
		}
	}
	if err := node.Envoy.Start(); err != nil {
		return nil, err
	}
	return node, nil
}

// controlAddr is the address the nodes reach the control server's gRPC listener at.
func (s *Stack) controlAddr() string {
	if s.spec.ControlHost == "" {
		return s.ControlXDS
	}
	_, port, _ := net.SplitHostPort(s.ControlXDS)
	return net.JoinHostPort(s.spec.ControlHost, port)
}

// StartPeerSidecar runs another sidecar of node beside the node's own, as a second replica
// of the node's data plane would run; no Envoy sends it requests, but it reports to the
// control server, exchanges placements with the node's sidecar, and watches the node's
// sidecar's requests in flight (--peers: the node's sidecar and its own address). It returns the peer's
// HTTP base URL (metrics, health), once it is healthy; Close stops it.
func (s *Stack) StartPeerSidecar(ctx context.Context, node string) (string, error) {
	if s.Nodes[node] == nil {
		return "", fmt.Errorf("no node %q", node)
	}
	grpcPort, err := s.ports.Port()
	if err != nil {
		return "", err
	}
	httpPort, err := s.ports.Port()
	if err != nil {
		return "", err
	}
	peerPort, err := s.ports.Port()
	if err != nil {
		return "", err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	// It watches the node's sidecar and itself (as a name listing every sidecar would).
	own := fmt.Sprintf("127.0.0.1:%d", peerPort)
	watch := own
	if n := s.Nodes[node]; n.SidecarPeer != "" {
		watch = n.SidecarPeer + "," + own
	}
	p := s.proc(fmt.Sprintf("sidecar-%s-peer%d", node, len(s.peers)+1), s.spec.Bins.Sidecar, append([]string{"--node-id", node,
		"--listen", fmt.Sprintf("127.0.0.1:%d", grpcPort), "--http-listen", fmt.Sprintf("127.0.0.1:%d", httpPort),
		"--control", s.controlAddr(), "--peer-listen", own, "--peers", watch}, append(s.tlsArgs(mtls.Sidecar(node)), s.spec.SidecarArgs...)...))
	if err := p.Start(); err != nil {
		return "", err
	}
	s.peers = append(s.peers, p)
	if err := waitUp(ctx, p, base+"/healthz", 200); err != nil {
		return "", fmt.Errorf("peer sidecar of %s: %w", node, err)
	}
	return base, nil
}

// tlsArgs are the TLS flags of id's process; none for a Plaintext stack.
func (s *Stack) tlsArgs(id mtls.Identity) []string {
	if s.PKI == nil {
		return nil
	}
	return tlsArgs(s.PKI.Files(id))
}

// WaitNodeReady waits until the node's sidecar has a routing snapshot and its Envoy is live
// with endpoints in every model cluster.
func (s *Stack) WaitNodeReady(ctx context.Context, node string) error {
	n := s.Nodes[node]
	if n.Sidecar.Running() {
		if err := waitUp(ctx, n.Sidecar, n.SidecarHTTP+"/healthz", 200); err != nil {
			return fmt.Errorf("sidecar %s: %w", node, err)
		}
	}
	if err := waitUp(ctx, n.Envoy, n.AdminURL+"/ready", 200); err != nil {
		return fmt.Errorf("envoy %s: %w", node, err)
	}
	for {
		ws, err := s.EnvoyWeights(ctx, node)
		if err == nil && len(ws) > 0 {
			ok := true
			for _, hosts := range ws {
				ok = ok && len(hosts) > 0
			}
			if ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("envoy %s has no endpoints: %w", node, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WriteFleet (re)writes the fleet file with the given static weights, atomically.
func (s *Stack) WriteFleet(weights map[string]map[string]uint32) error {
	f := fleet.Fleet{Weights: weights, RTTMillis: s.spec.RTTMillis}
	models := map[string]bool{}
	regions := map[string]bool{}
	for _, e := range s.spec.Engines {
		for _, m := range e.Models {
			if !models[m] {
				models[m] = true
				f.Models = append(f.Models, fleet.Model{Name: m})
			}
		}
		regions[e.Region] = true
		c := e.CapacityRPS
		if c == 0 {
			c = 20
		}
		f.Engines = append(f.Engines, fleet.Engine{Name: e.Name, Address: s.Engines[e.Name].Address, Region: e.Region, Models: e.Models, CapacityRPS: c, PrefillShare: e.PrefillShare, MaxInFlight: e.MaxInFlight})
	}
	if f.RTTMillis == nil {
		f.RTTMillis = map[string]map[string]float64{}
		for _, n := range s.spec.Nodes {
			f.RTTMillis[n.Name] = map[string]float64{}
			for r := range regions {
				f.RTTMillis[n.Name][r] = 40
				if r == n.Region {
					f.RTTMillis[n.Name][r] = 1
				}
			}
		}
	}
	for _, n := range s.spec.Nodes {
		f.Clusters = append(f.Clusters, fleet.Cluster{Name: n.Name, Region: n.Region})
	}
	data, err := yaml.Marshal(&f)
	if err != nil {
		return err
	}
	if _, err := fleet.Parse(s.FleetPath, data); err != nil {
		return fmt.Errorf("stack wrote an invalid fleet: %w", err)
	}
	tmp := s.FleetPath + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.FleetPath)
}

// EnvoyWeights reads a node's Envoy admin /clusters: for each model cluster, the weight of
// each priority-0 host address (failover hosts at priority 1 carry no share).
func (s *Stack) EnvoyWeights(ctx context.Context, node string) (map[string]map[string]uint32, error) {
	return s.envoyHosts(ctx, node, false)
}

// EnvoyMembers is EnvoyWeights with every host Envoy holds, failover hosts (priority >= 1)
// included: what discovery put into EDS, whatever share the plan gives it.
func (s *Stack) EnvoyMembers(ctx context.Context, node string) (map[string]map[string]uint32, error) {
	return s.envoyHosts(ctx, node, true)
}

func (s *Stack) envoyHosts(ctx context.Context, node string, failover bool) (map[string]map[string]uint32, error) {
	var doc struct {
		ClusterStatuses []struct {
			Name         string `json:"name"`
			HostStatuses []struct {
				Address struct {
					SocketAddress struct {
						Address   string `json:"address"`
						PortValue int    `json:"port_value"`
					} `json:"socket_address"`
				} `json:"address"`
				Weight   uint32 `json:"weight"`
				Priority uint32 `json:"priority"`
			} `json:"host_statuses"`
		} `json:"cluster_statuses"`
	}
	if err := getJSON(ctx, s.Nodes[node].AdminURL+"/clusters?format=json", &doc); err != nil {
		return nil, err
	}
	out := map[string]map[string]uint32{}
	for _, c := range doc.ClusterStatuses {
		if len(c.Name) < 6 || c.Name[:6] != "model-" {
			continue
		}
		hosts := map[string]uint32{}
		for _, h := range c.HostStatuses {
			if h.Priority > 0 && !failover {
				continue // failover engines carry no share
			}
			hosts[h.Address.SocketAddress.Address+":"+strconv.Itoa(h.Address.SocketAddress.PortValue)] = h.Weight
		}
		out[c.Name] = hosts
	}
	return out, nil
}

// PublishedWeights reads the control server's /debug/state: for each model cluster of node,
// the weight of each engine address.
func (s *Stack) PublishedWeights(ctx context.Context, node string) (map[string]map[string]uint32, error) {
	var doc struct {
		Nodes map[string]struct {
			Models map[string]struct {
				Weights map[string]uint32 `json:"weights"`
			} `json:"models"`
		} `json:"nodes"`
	}
	if err := getJSON(ctx, s.ControlHTTP+"/debug/state", &doc); err != nil {
		return nil, err
	}
	out := map[string]map[string]uint32{}
	for model, m := range doc.Nodes[node].Models {
		hosts := map[string]uint32{}
		for engine, w := range m.Weights {
			if e, ok := s.Engines[engine]; ok {
				hosts[e.Address] = w
			}
		}
		out[xdsapi.ClusterName(model)] = hosts
	}
	return out, nil
}

// EngineByAddress maps an engine address back to its name.
func (s *Stack) EngineByAddress(addr string) string {
	for _, e := range s.Engines {
		if e.Address == addr {
			return e.Name
		}
	}
	return ""
}

// Close stops every process of the stack.
func (s *Stack) Close() {
	for _, n := range s.Nodes {
		n.Envoy.Stop(2 * time.Second)
		n.Sidecar.Stop(2 * time.Second)
	}
	for _, p := range s.peers {
		p.Stop(2 * time.Second)
	}
	if s.Control != nil {
		s.Control.Stop(2 * time.Second)
	}
	for _, e := range s.Engines {
		e.Proc.Stop(2 * time.Second)
	}
}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func joinModels(ms []string) string {
	out := ""
	for i, m := range ms {
		if i > 0 {
			out += ","
		}
		out += m
	}
	return out
}
