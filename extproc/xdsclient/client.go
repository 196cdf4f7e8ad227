package xdsclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/meridian-router/meridian/xdsapi"
)

// View is what one node should route on (xdsapi.View); Model one model's part of it.
type (
	View  = xdsapi.View
	Model = xdsapi.ModelView
)

// Config configures a Client.
type Config struct {
	NodeID   string
	Conn     grpc.ClientConnInterface
	OnUpdate func(*View)
	Log      *slog.Logger
	// MaxBackoff caps the wait between reconnects (doubling from 100 ms).
	MaxBackoff time.Duration
	// OnStreamError, when set, is told why each stream ended (a refused node id, an
	// unreachable or untrusted control server), so the caller can say why it has no view.
	OnStreamError func(error)
}

// Run keeps a subscription open until ctx is done.
func Run(ctx context.Context, cfg Config) error {
	if cfg.NodeID == "" || cfg.Conn == nil || cfg.OnUpdate == nil || cfg.Log == nil {
		return errors.New("xdsclient: NodeID, Conn, OnUpdate and Log are required")
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		err := subscribe(ctx, cfg)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		if cfg.OnStreamError != nil {
			cfg.OnStreamError(err)
		}
		cfg.Log.Warn("xDS stream ended; keeping the last view and reconnecting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, cfg.MaxBackoff)
	}
}

type state struct {
	clusters    map[string]*clusterv3.Cluster // by cluster name
	assignments map[string]*endpointv3.ClusterLoadAssignment
	edsNames    []string
	edsVersion  string
}

func subscribe(ctx context.Context, cfg Config) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cfg.Conn).StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("open ADS stream: %w", err)
	}
	node := &corev3.Node{Id: cfg.NodeID, Cluster: "meridian-sidecar"}
	send := func(typeURL, version, nonce string, names []string, nack error) error {
		req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, VersionInfo: version, ResponseNonce: nonce, ResourceNames: names}
		if nack != nil {
			req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: nack.Error()}
		}
		return stream.Send(req)
	}
	if err := send(resourcev3.ClusterType, "", "", nil, nil); err != nil {
		return fmt.Errorf("request clusters: %w", err)
	}
	st := &state{clusters: map[string]*clusterv3.Cluster{}, assignments: map[string]*endpointv3.ClusterLoadAssignment{}}
	var cdsVersion string
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		switch resp.GetTypeUrl() {
		case resourcev3.ClusterType:
			clusters, err := decodeClusters(resp)
			if err != nil {
				cfg.Log.Error("NACK clusters", "version", resp.GetVersionInfo(), "err", err)
				if err := send(resourcev3.ClusterType, cdsVersion, resp.GetNonce(), nil, err); err != nil {
					return err
				}
				continue
			}
			cdsVersion = resp.GetVersionInfo()
			st.clusters = clusters
			if err := send(resourcev3.ClusterType, cdsVersion, resp.GetNonce(), nil, nil); err != nil {
				return err
			}
			names := make([]string, 0, len(clusters))
			for n := range clusters {
				names = append(names, n)
			}
			sort.Strings(names)
			if !slices.Equal(names, st.edsNames) {
				st.edsNames = names
				if err := send(resourcev3.EndpointType, st.edsVersion, "", names, nil); err != nil {
					return err
				}
			}
			if v := st.view(); v != nil {
				cfg.OnUpdate(v)
			}
		case resourcev3.EndpointType:
			claByName, err := decodeAssignments(resp)
			if err != nil {
				cfg.Log.Error("NACK endpoints", "version", resp.GetVersionInfo(), "err", err)
				if err := send(resourcev3.EndpointType, st.edsVersion, resp.GetNonce(), st.edsNames, err); err != nil {
					return err
				}
				continue
			}
			st.edsVersion = resp.GetVersionInfo()
			st.assignments = claByName
			if err := send(resourcev3.EndpointType, st.edsVersion, resp.GetNonce(), st.edsNames, nil); err != nil {
				return err
			}
			if v := st.view(); v != nil {
				cfg.OnUpdate(v)
			}
		default:
			// Not asked for; ACK so the server does not wait on us.
			if err := send(resp.GetTypeUrl(), resp.GetVersionInfo(), resp.GetNonce(), nil, nil); err != nil {
				return err
			}
		}
	}
}

func decodeClusters(resp *discoveryv3.DiscoveryResponse) (map[string]*clusterv3.Cluster, error) {
	out := map[string]*clusterv3.Cluster{}
	for _, a := range resp.GetResources() {
		c := &clusterv3.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			return nil, fmt.Errorf("decode cluster: %w", err)
		}
		if xdsapi.ModelOf(c) == "" {
			continue // not a model cluster
		}
		out[c.GetName()] = c
	}
	return out, nil
}

func decodeAssignments(resp *discoveryv3.DiscoveryResponse) (map[string]*endpointv3.ClusterLoadAssignment, error) {
	out := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, a := range resp.GetResources() {
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := a.UnmarshalTo(cla); err != nil {
			return nil, fmt.Errorf("decode assignment: %w", err)
		}
		if _, err := xdsapi.EndpointsOf(cla); err != nil {
			return nil, err
		}
		out[cla.GetClusterName()] = cla
	}
	return out, nil
}

// view returns the current view once every cluster has its assignment, else nil.
func (st *state) view() *View {
	v := &View{Version: st.edsVersion, Models: map[string]Model{}}
	for name, c := range st.clusters {
		cla, ok := st.assignments[name]
		if !ok {
			return nil
		}
		eps, _ := xdsapi.EndpointsOf(cla) // checked when decoded
		m := xdsapi.ModelOf(c)
		v.Models[m] = Model{Name: m, Cluster: name, Endpoints: eps}
	}
	return v
}
