package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meridian-router/meridian/extproc/decide"
	meridianv1 "github.com/meridian-router/meridian/proto/meridian/v1"
)

// The peer exchange's fixed timings. A sidecar sends a snapshot when its requests in
// flight changed since the last one, and at least every peerHeartbeat; a watcher that hears
// nothing for peerSilence drops the peer's snapshot and reconnects. Names in --peers are
// looked up again every peerResolveInterval, so pods that come and go are found.
const (
	peerHeartbeat       = time.Second
	peerSilence         = 3 * peerHeartbeat
	peerResolveInterval = 5 * time.Second
)

// errSelf ends a watch of this sidecar's own address (a --peers name resolves to every
// sidecar of the node, this one included).
var errSelf = errors.New("the address is this sidecar's own")

// PeerLoad returns the meridian.v1.PeerLoad service of this sidecar: every
// peers.interval, each of the node's other sidecars that watches it gets what this
// sidecar holds in flight per engine (decide.Core.AppendInFlight) if it changed, and at
// least every second. Only watchers of the same node are answered; the transport
// authenticates them (mutual TLS naming the node's sidecar, cmd/meridian-sidecar).
func (s *Server) PeerLoad(nodeID, sidecarID string) meridianv1.PeerLoadServer {
	return &peerLoad{s: s, node: nodeID, id: sidecarID}
}

type peerLoad struct {
	meridianv1.UnimplementedPeerLoadServer
	s        *Server
	node, id string
}

func (p *peerLoad) WatchInFlight(hello *meridianv1.PeerHello, stream meridianv1.PeerLoad_WatchInFlightServer) error {
	if hello.GetNodeId() != p.node {
		return status.Errorf(codes.InvalidArgument, "node %q is not this sidecar's node %q: peers share one node's traffic", hello.GetNodeId(), p.node)
	}
	var (
		cur, prev  []decide.EngineInFlight
		ranked     int64
		prevRanked int64 = -1
		lastSent   time.Time
	)
	t := time.NewTicker(p.s.cfg.PeerInterval)
	defer t.Stop()
	for {
		cur, ranked = p.s.core.AppendInFlight(cur[:0])
		if len(cur) > meridianv1.MaxInFlightEngines {
			cur = cur[:meridianv1.MaxInFlightEngines]
		}
		if ranked != prevRanked || !slices.Equal(cur, prev) || time.Since(lastSent) >= peerHeartbeat {
			if err := stream.Send(inFlightMessage(p.id, cur, ranked)); err != nil {
				return err
			}
			prev, prevRanked, lastSent = append(prev[:0], cur...), ranked, time.Now()
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-t.C:
		}
	}
}

// inFlightMessage is a snapshot as the wire carries it.
func inFlightMessage(id string, es []decide.EngineInFlight, ranked int64) *meridianv1.InFlight {
	m := &meridianv1.InFlight{SidecarId: id, RankedWork: ranked, Engines: make([]*meridianv1.EngineInFlight, len(es))}
	for i, e := range es {
		m.Engines[i] = &meridianv1.EngineInFlight{Address: e.Address, Requests: e.Requests, Work: e.Work}
	}
	return m
}

// PeerDialer opens a client connection to a peer's PeerLoad address (ip:port), with the
// transport credentials the sidecar uses for its peers; the watch closes it.
type PeerDialer func(target string) (*grpc.ClientConn, error)

// WatchPeers watches the PeerLoad service of every address peers name (host:port; a name
// that resolves to several addresses, such as a headless Service of the node's sidecar
// pods, stands for each), until ctx is done: each snapshot a peer sends replaces the
// last in the decision core (decide.Core.SetPeerInFlight, under the sender's name), and a
// peer whose streams all end or go silent for three seconds is forgotten (DropPeer) until
// it sends again. Names are looked up again every five seconds (a lookup that fails keeps
// the name's last addresses); this sidecar's own address is recognized by the name in its
// snapshots and left alone, and a sidecar reached at two addresses counts once.
func (s *Server) WatchPeers(ctx context.Context, peers []string, dial PeerDialer, nodeID, sidecarID string) {
	w := &peerWatch{s: s, dial: dial, node: nodeID, id: sidecarID, running: map[string]context.CancelFunc{},
		self: map[string]bool{}, live: map[string]int{}, resolved: map[string][]string{}}
	defer w.stopAll()
	for {
		w.reconcile(ctx, w.resolve(ctx, peers))
		select {
		case <-ctx.Done():
			return
		case <-time.After(peerResolveInterval):
		}
	}
}

type peerWatch struct {
	s        *Server
	dial     PeerDialer
	node, id string
	mu       sync.Mutex
	running  map[string]context.CancelFunc // target -> its watch
	self     map[string]bool               // targets found to be this sidecar
	live     map[string]int                // sender name -> its streams that have sent a snapshot
	wg       sync.WaitGroup
	// resolved is each --peers name's last good lookup (resolve's goroutine only).
	resolved map[string][]string
}

// reconcile starts a watch for each new target and stops those no longer named.
func (w *peerWatch) reconcile(ctx context.Context, targets []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for target, cancel := range w.running {
		if !slices.Contains(targets, target) {
			cancel()
			delete(w.running, target)
		}
	}
	for target := range w.self {
		if !slices.Contains(targets, target) {
			delete(w.self, target) // the address may be another sidecar's next time
		}
	}
	for _, target := range targets {
		if _, ok := w.running[target]; ok || w.self[target] {
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		w.running[target] = cancel
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.watch(wctx, target)
		}()
	}
}

func (w *peerWatch) stopAll() {
	w.mu.Lock()
	for _, cancel := range w.running {
		cancel()
	}
	w.mu.Unlock()
	w.wg.Wait()
}

// watch keeps one peer's stream open, with backoff, until ctx ends or the target turns
// out to be this sidecar.
func (w *peerWatch) watch(ctx context.Context, target string) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		began := time.Now()
		err := w.watchOnce(ctx, target)
		if errors.Is(err, errSelf) {
			w.s.cfg.Log.Info("peer address is this sidecar's own; not watched", "peer", target)
			w.mu.Lock()
			w.self[target] = true
			w.mu.Unlock()
			return
		}
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		w.s.cfg.Log.Debug("peer stream ended", "peer", target, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// watchOnce runs one stream to target until it ends; the sender's snapshot is forgotten
// then, unless another of its streams is live.
func (w *peerWatch) watchOnce(ctx context.Context, target string) error {
	conn, err := w.dial(target)
	if err != nil {
		return fmt.Errorf("peer %s: %w", target, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := meridianv1.NewPeerLoadClient(conn).WatchInFlight(ctx, &meridianv1.PeerHello{NodeId: w.node, SidecarId: w.id})
	if err != nil {
		return err
	}
	silent := time.AfterFunc(peerSilence, cancel)
	defer silent.Stop()
	sender := ""
	defer func() {
		if sender != "" {
			w.release(sender)
		}
	}()
	var es []decide.EngineInFlight
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		silent.Reset(peerSilence)
		id := m.GetSidecarId()
		if id == w.id {
			return errSelf
		}
		if id == "" || (sender != "" && id != sender) {
			return fmt.Errorf("peer %s named itself %q after %q", target, id, sender)
		}
		if len(m.GetEngines()) > meridianv1.MaxInFlightEngines {
			return fmt.Errorf("peer %s sent %d engines, more than %d", target, len(m.GetEngines()), meridianv1.MaxInFlightEngines)
		}
		if sender == "" {
			sender = id
			w.mu.Lock()
			w.live[sender]++
			w.mu.Unlock()
		}
		es = es[:0]
		for _, e := range m.GetEngines() {
			es = append(es, decide.EngineInFlight{Address: e.GetAddress(), Requests: e.GetRequests(), Work: e.GetWork()})
		}
		w.s.core.SetPeerInFlight(sender, es, m.GetRankedWork())
	}
}

// release ends one of sender's streams; with its last, its snapshot is forgotten.
func (w *peerWatch) release(sender string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.live[sender]--; w.live[sender] > 0 {
		return
	}
	delete(w.live, sender)
	w.s.core.DropPeer(sender)
}

// resolve expands each host:port in peers into an address per IP its host resolves to
// (an IP stays as it is; an IPv6 one in brackets), sorted and without duplicates. A name
// whose lookup fails keeps its last good addresses, and is logged.
func (w *peerWatch) resolve(ctx context.Context, peers []string) []string {
	var out []string
	for _, p := range peers {
		addrs, err := resolvePeer(ctx, p)
		if err != nil {
			w.s.cfg.Log.Warn("peer name does not resolve; keeping its last addresses", "peer", p, "last", w.resolved[p], "err", err)
			addrs = w.resolved[p]
		} else {
			w.resolved[p] = addrs
		}
		out = append(out, addrs...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// resolvePeer is the addresses p (host:port) stands for: itself when host is an IP, else
// one per IP the name resolves to.
func resolvePeer(ctx context.Context, p string) ([]string, error) {
	host, port, err := net.SplitHostPort(p)
	if err != nil {
		return nil, err
	}
	if net.ParseIP(host) != nil {
		return []string{net.JoinHostPort(host, port)}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = net.JoinHostPort(ip, port)
	}
	return out, nil
}
