package picker

import "sync"

// rankingsKept is how many rankings a Rankings remembers: one per distinct set of
// ranked endpoints that its tables are built on in turn (a simulator's regions).
const rankingsKept = 16

// Rankings remembers the key rankings of the last tables built with it, so that cores
// that build tables on the same views in one process (the simulator runs every
// replica of a node's sidecar) rank each set of endpoints once. A table's ranking is a
// function of its ranked endpoints' addresses and weights and of Config.Buckets and
// Candidates (NewTable), so a remembered one is the one the table would compute: a
// table built with a Rankings is the table NewTable builds. The zero value is ready;
// a nil *Rankings remembers nothing. Safe for concurrent use.
type Rankings struct {
	mu     sync.Mutex
	recent [rankingsKept]*ranking
	next   int // the entry the next new ranking replaces
}

// ranking is one remembered ranking and what it is a function of.
type ranking struct {
	buckets, k int
	addrs      []string
	weights    []float64
	slots      []uint16 // shared by every table that uses it: never written after rank
}

// NewTable is NewTable, with the ranking taken from r when r remembers one for the same
// ranked endpoints, buckets and candidates.
func (r *Rankings) NewTable(cfg Config, endpoints []Endpoint, loads *Loads) (*Table, error) {
	return newTable(cfg, endpoints, loads, r)
}

// slots returns the ranking of eps (sorted by address, all with weight > 0), computed
// once per distinct input among the last rankingsKept.
func (r *Rankings) slots(eps []Endpoint, buckets, k int) []uint16 {
	if r == nil {
		return rank(eps, buckets, k)
	}
	r.mu.Lock()
	for _, g := range r.recent {
		if g != nil && g.matches(eps, buckets, k) {
			r.mu.Unlock()
			return g.slots
		}
	}
	r.mu.Unlock()
	g := &ranking{buckets: buckets, k: k, addrs: make([]string, len(eps)), weights: make([]float64, len(eps)),
		slots: rank(eps, buckets, k)}
	for i, ep := range eps {
		g.addrs[i], g.weights[i] = ep.Address, ep.Weight
	}
	r.mu.Lock()
	r.recent[r.next] = g
	r.next = (r.next + 1) % rankingsKept
	r.mu.Unlock()
	return g.slots
}

// matches reports whether g is the ranking of eps with buckets and k.
func (g *ranking) matches(eps []Endpoint, buckets, k int) bool {
	if g.buckets != buckets || g.k != k || len(g.addrs) != len(eps) {
		return false
	}
	for i, ep := range eps {
		if g.addrs[i] != ep.Address || g.weights[i] != ep.Weight {
			return false
		}
	}
	return true
}
