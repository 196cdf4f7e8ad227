package decide

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meridian-router/meridian/extproc/guard"
	"github.com/meridian-router/meridian/extproc/picker"
	"github.com/meridian-router/meridian/xdsapi"
)

// routing is one immutable snapshot of what the core routes on: the node's xDS view with
// every EDS weight multiplied by the local outlier penalty.
type routing struct {
	view      *xdsapi.View
	penalties uint64 // guard.Penalties.Version the weights include
	models    map[string]*modelRoute
	engines   map[string]string        // address -> engine name
	rtt       map[string]time.Duration // address -> network round trip from this node
	targets   []LoadTarget             // engines with a share (or overflow) that publish a metrics URL, by address (Core.LoadTargets)
}

type modelRoute struct {
	name    string
	cluster string
	table   *picker.Table
	// failover are engines the node gives no share but may retry (EDS priority >= 1),
	// appended to the endpoint list when the table yields fewer than wanted.
	failover []failover
	// state is the model's long-lived request-path state, shared by every snapshot.
	state *modelState
}

type failover struct{ address, engine string }

// newRouting builds the picker tables. Draining endpoints are left out: override_host
// would send to them, since it does not check health. state returns each model's
// long-lived state. A model whose table prev already holds for the same endpoints and
// weights keeps that table (NewTable is a function of its inputs, so a new one would rank
// every key the same): a penalty on one engine rebuilds only the tables of the models it
// serves. built is how many tables were built; memo (nil: none) shares rankings between
// cores.
//
// The overflow nearest failover engines (by round trip, then address), unless the outlier
// guard penalizes them, join the table as its overflow endpoints (picker.Endpoint.Overflow),
// and are scraped like the engines with a share.
func newRouting(v *xdsapi.View, pen *guard.Penalties, cfg picker.Config, overflow int, memo *picker.Rankings, loads *picker.Loads, state func(model string) *modelState, prev *routing) (r *routing, built int, err error) {
	r = &routing{view: v, models: make(map[string]*modelRoute, len(v.Models)), engines: map[string]string{}, rtt: map[string]time.Duration{}}
	metrics := map[string]string{} // address -> metrics URL
	if pen != nil {
		r.penalties = pen.Version
	}
	for name, m := range v.Models {
		eps := make([]picker.Endpoint, 0, len(m.Endpoints))
		var fo []failover
		var spare []xdsapi.Endpoint
		for _, e := range m.Endpoints {
			r.engines[e.Address] = e.Engine
			r.rtt[e.Address] = time.Duration(e.RTTMillis * float64(time.Millisecond))
			if e.Draining || e.Weight == 0 {
				continue
			}
			if e.Priority > 0 {
				fo = append(fo, failover{e.Address, e.Engine})
				if pen.Factor(e.Engine) == 1 {
					spare = append(spare, e)
				}
				continue
			}
			if e.MetricsURL != "" {
				metrics[e.Address] = e.MetricsURL
			}
			eps = append(eps, picker.Endpoint{
				Address:     e.Address,
				Engine:      e.Engine,
				Weight:      float64(e.Weight) * pen.Factor(e.Engine),
				MaxInFlight: int64(e.MaxInFlight),
			})
		}
		if overflow > 0 && cfg.OverflowAt > 0 && len(eps) > 0 {
			slices.SortFunc(spare, func(a, b xdsapi.Endpoint) int {
				return cmp.Or(cmp.Compare(a.RTTMillis, b.RTTMillis), strings.Compare(a.Address, b.Address))
			})
			ranked := make(map[string]bool, len(eps))
			for _, ep := range eps {
				ranked[ep.Address] = true
			}
			spare = slices.DeleteFunc(spare, func(e xdsapi.Endpoint) bool { return ranked[e.Address] })
			for _, e := range spare[:min(overflow, len(spare))] {
				eps = append(eps, picker.Endpoint{Address: e.Address, Engine: e.Engine, MaxInFlight: int64(e.MaxInFlight), Overflow: true})
				if e.MetricsURL != "" {
					metrics[e.Address] = e.MetricsURL
				}
			}
		}
		var t *picker.Table
		if old := prev.model(name); old != nil && sameEndpoints(old.table, eps) {
			t = old.table
		} else if t, err = memo.NewTable(cfg, eps, loads); err != nil {
			return nil, built, fmt.Errorf("model %s: %w", name, err)
		} else {
			built++
		}
		r.models[name] = &modelRoute{name: name, cluster: m.Cluster, table: t, failover: fo, state: state(name)}
	}
	for addr, u := range metrics {
		r.targets = append(r.targets, LoadTarget{Address: addr, MetricsURL: u})
	}
	slices.SortFunc(r.targets, func(a, b LoadTarget) int { return strings.Compare(a.Address, b.Address) })
	return r, built, nil
}

// model returns the named model's route; nil for a nil routing or an unknown model.
func (r *routing) model(name string) *modelRoute {
	if r == nil {
		return nil
	}
	return r.models[name]
}

// sameEndpoints reports whether t was built from exactly the endpoints with positive
// weight in eps (in any order), with the same weights, names and caps, and the same
// overflow endpoints in the same order.
func sameEndpoints(t *picker.Table, eps []picker.Endpoint) bool {
	n, o := 0, 0
	for _, ep := range eps {
		switch {
		case ep.Overflow:
			if o >= t.Overflows() || t.Endpoint(t.Len()+o) != ep {
				return false
			}
			o++
		case ep.Weight > 0:
			n++
			i, ok := t.Lookup(ep.Address)
			if !ok || i >= t.Len() || t.Endpoint(i) != ep {
				return false
			}
		}
	}
	return n == t.Len() && o == t.Overflows()
}
