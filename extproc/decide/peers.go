package decide

import (
	"maps"
	"slices"
)

// EngineInFlight is one engine's requests and their work in flight from one sidecar: what
// the sidecars of a node send each other (AppendInFlight, SetPeerInFlight), so that each
// judges an engine's load and its share with the others' requests counted the instant
// they start and end, where its scrape of the engine sees them up to a scrape interval
// late.
type EngineInFlight struct {
	Address  string
	Requests int64
	Work     int64 // in the picker's units: prompt tokens plus Config.DecodeWork each
}

// peerInFlight is what one peer last sent.
type peerInFlight struct {
	engines []EngineInFlight
	ranked  int64
}

// AppendInFlight appends to dst this core's own requests in flight, per engine address
// (engines with none are left out), sorted by address, and returns it with their work on
// the engines that hold a share (not overflow engines): the snapshot a peer's
// SetPeerInFlight takes. Call it from the peer exchange, not per request.
func (c *Core) AppendInFlight(dst []EngineInFlight) ([]EngineInFlight, int64) {
	c.loads.Each(func(addr string, requests, work int64) { // in address order
		dst = append(dst, EngineInFlight{Address: addr, Requests: requests, Work: work})
	})
	return dst, c.loads.RankedWork()
}

// SetPeerInFlight records what the peer sidecar of the same node named peer holds in
// flight (its AppendInFlight), replacing what it sent before. Until the next snapshot
// replaces it or DropPeer forgets it, the picker counts the peer's work with this core's
// own, in bounded loads and in the least-work choice, and ObserveEngineLoad nets it out
// of what the engines' scrapes show. Off the request path: it takes peersMu and the
// Loads' mutex.
func (c *Core) SetPeerInFlight(peer string, engines []EngineInFlight, ranked int64) {
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	if c.peers == nil {
		c.peers = map[string]peerInFlight{}
	}
	if old, ok := c.peers[peer]; ok && old.ranked == ranked && slices.Equal(old.engines, engines) {
		return // the same snapshot again (a peer with nothing started or ended since): the sums stand
	}
	c.peers[peer] = peerInFlight{engines: slices.Clone(engines), ranked: ranked}
	c.sumPeersLocked()
}

// DropPeer forgets what the peer sidecar named peer sent (its stream ended, or went
// silent): its requests count again only as the engines' scrapes show them.
func (c *Core) DropPeer(peer string) {
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	if _, ok := c.peers[peer]; !ok {
		return
	}
	delete(c.peers, peer)
	c.sumPeersLocked()
}

// Peers is the names of the peers whose snapshot the core holds, sorted.
func (c *Core) Peers() []string {
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	return slices.Sorted(maps.Keys(c.peers))
}

// sumPeersLocked sums the peers' snapshots per engine into peerSum and the picker's
// counters. peersMu is held.
func (c *Core) sumPeersLocked() {
	sum := make(map[string]EngineInFlight, len(c.peerSum))
	work := make(map[string]int64, len(c.peerSum))
	var ranked int64
	for _, p := range c.peers {
		ranked += clampPeer(p.ranked)
		for _, e := range p.engines {
			s := sum[e.Address]
			s.Requests += clampPeer(e.Requests)
			s.Work += clampPeer(e.Work)
			sum[e.Address] = s
			work[e.Address] = s.Work
		}
	}
	c.peerSum = sum
	c.loads.SetPeers(work, ranked)
}

// maxPeerFigure bounds one figure of a peer's snapshot (2^40 tokens of work, a thousand
// times a large fleet's), so that sums over peers cannot overflow.
const maxPeerFigure = 1 << 40

// clampPeer is a peer's figure within [0, maxPeerFigure].
func clampPeer(v int64) int64 { return min(max(v, 0), maxPeerFigure) }

// peerInFlightAt is the peers' requests and work in flight on addr, as they last sent it.
func (c *Core) peerInFlightAt(addr string) EngineInFlight {
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	return c.peerSum[addr]
}

// PeerInFlight returns the requests the node's other sidecars hold in flight, per engine
// name, as they last sent them (SetPeerInFlight), for the sidecar's metrics.
func (c *Core) PeerInFlight() map[string]int64 {
	out := map[string]int64{}
	r := c.routing.Load()
	if r == nil {
		return out
	}
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	for addr, e := range c.peerSum {
		if engine, ok := r.engines[addr]; ok && e.Requests > 0 {
			out[engine] = e.Requests
		}
	}
	return out
}
