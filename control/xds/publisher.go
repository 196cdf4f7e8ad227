package xds

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/meridian-router/meridian/xdsapi"
)

// Publisher owns the snapshot cache.
type Publisher struct {
	cache    cachev3.SnapshotCache
	log      *slog.Logger
	clusters xdsapi.ClusterOptions
	routes   xdsapi.RouteOptions

	// epoch makes versions unique across restarts: a client that reconnects with the
	// version of an older server instance always gets the new snapshot.
	epoch string

	mu      sync.Mutex
	version uint64
	last    map[string][]types.Resource // node -> resources of its current snapshot, in type order
	plan    *Plan
}

// NewPublisher returns a Publisher over a fresh ADS snapshot cache.
func NewPublisher(log *slog.Logger, clusters xdsapi.ClusterOptions, routes xdsapi.RouteOptions) *Publisher {
	return &Publisher{
		cache:    cachev3.NewSnapshotCache(true, cachev3.IDHash{}, slogAdapter{log}),
		epoch:    newEpoch(),
		log:      log,
		clusters: clusters,
		routes:   routes,
		last:     map[string][]types.Resource{},
	}
}

// Cache is the snapshot cache to serve over ADS.
func (p *Publisher) Cache() cachev3.SnapshotCache { return p.cache }

// Version is the version of the newest published change ("" before the first).
func (p *Publisher) Version() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.version == 0 {
		return ""
	}
	return p.versionString()
}

func (p *Publisher) versionString() string {
	return p.epoch + "-" + strconv.FormatUint(p.version, 10)
}

// Sequence is the number of changes published so far.
func (p *Publisher) Sequence() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.version
}

// Plan is the last plan that was published (nil before the first). It must not be modified.
func (p *Publisher) Plan() *Plan {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.plan
}

// Publish checks plan and, if it is sound, sets a new snapshot for every node whose
// resources changed. It returns the nodes it updated. On error nothing is published.
func (p *Publisher) Publish(ctx context.Context, plan *Plan) ([]string, error) {
	built := map[string]map[resourcev3.Type][]types.Resource{}
	for node := range plan.Assignments {
		res, err := p.build(plan, node)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", node, err)
		}
		built[node] = res
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var changed []string
	for node, res := range built {
		if sameResources(p.last[node], flatten(res)) {
			continue
		}
		changed = append(changed, node)
	}
	if len(changed) == 0 {
		p.plan = plan
		return nil, nil
	}
	p.version++
	v := p.versionString()
	for _, node := range changed {
		snap, err := cachev3.NewSnapshot(v, built[node])
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", node, err)
		}
		if err := p.cache.SetSnapshot(ctx, node, snap); err != nil {
			return nil, fmt.Errorf("node %s: set snapshot: %w", node, err)
		}
		p.last[node] = flatten(built[node])
	}
	p.plan = plan
	p.log.Info("published snapshot", "version", v, "nodes", changed)
	return changed, nil
}

func (p *Publisher) build(plan *Plan, node string) (map[resourcev3.Type][]types.Resource, error) {
	if len(plan.Models) == 0 {
		return nil, errors.New("plan has no models")
	}
	var clusters, endpoints []types.Resource
	known := map[string]bool{}
	for _, m := range plan.Models {
		c, err := xdsapi.Cluster(m, p.clusters)
		if err != nil {
			return nil, err
		}
		if known[c.Name] {
			return nil, fmt.Errorf("models map to the same cluster name %s", c.Name)
		}
		known[c.Name] = true
		cla, err := xdsapi.LoadAssignment(c.Name, plan.Assignments[node][m])
		if err != nil {
			return nil, err
		}
		if err := xdsapi.Validate(c, cla); err != nil {
			return nil, err
		}
		clusters = append(clusters, c)
		endpoints = append(endpoints, cla)
	}
	rc := xdsapi.RouteConfig(plan.DefaultModel, p.routes)
	if !known[xdsapi.ClusterName(plan.DefaultModel)] {
		return nil, fmt.Errorf("default model %q has no cluster", plan.DefaultModel)
	}
	if err := xdsapi.Validate(rc); err != nil {
		return nil, err
	}
	return map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  clusters,
		resourcev3.EndpointType: endpoints,
		resourcev3.RouteType:    {rc},
	}, nil
}

func flatten(res map[resourcev3.Type][]types.Resource) []types.Resource {
	var out []types.Resource
	for _, t := range []resourcev3.Type{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.RouteType} {
		out = append(out, res[t]...)
	}
	return out
}

func sameResources(a, b []types.Resource) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// slogAdapter lets go-control-plane log through slog.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Debugf(format string, args ...any) { a.l.Debug(fmt.Sprintf(format, args...)) }
func (a slogAdapter) Infof(format string, args ...any)  { a.l.Debug(fmt.Sprintf(format, args...)) }
func (a slogAdapter) Warnf(format string, args ...any)  { a.l.Warn(fmt.Sprintf(format, args...)) }
func (a slogAdapter) Errorf(format string, args ...any) { a.l.Error(fmt.Sprintf(format, args...)) }

// newEpoch names one server instance: its start time, plus randomness for two instances
// started in the same instant.
func newEpoch() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return strconv.FormatInt(time.Now().Unix(), 36) + hex.EncodeToString(b[:])
}
