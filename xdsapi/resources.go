package xdsapi

import (
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	maglevv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/maglev/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Names shared by the control server, the sidecar and the bootstrap.
const (
	// HeaderDestination carries the sidecar's ordered "ip:port,ip:port" list (the Gateway API
	// Inference Extension's endpoint-picker header).
	HeaderDestination = "x-gateway-destination-endpoint"
	// MetadataNamespaceLB is the dynamic metadata namespace override_host also reads.
	MetadataNamespaceLB = "envoy.lb"
	// HeaderCluster names the model's Envoy cluster; the route table routes on it.
	HeaderCluster = "x-meridian-cluster"
	// HeaderPrefixHash carries the prefix key so Envoy's Maglev fallback keeps affinity.
	HeaderPrefixHash = "x-meridian-prefix-hash"
	// MetadataNamespaceEngine holds engine identity on each LbEndpoint and model on each cluster.
	MetadataNamespaceEngine = "meridian"
	// MetadataNamespaceDecision is the request's dynamic metadata namespace the sidecar
	// writes its decision under; the bootstrap's access log prints it.
	MetadataNamespaceDecision = "meridian.decision"
	// RouteConfigName is the route table the bootstrap's listener asks for over RDS.
	RouteConfigName = "meridian-routes"
)

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// ClusterName is the Envoy cluster that serves model.
func ClusterName(model string) string {
	return "model-" + unsafeChars.ReplaceAllString(model, "_")
}

// Endpoint is one engine as one node sees it.
type Endpoint struct {
	Engine  string
	Region  string
	Address string // ip:port
	// Weight is the EDS load_balancing_weight; it must be >= 1.
	Weight   uint32
	Draining bool
	// MaxInFlight is the sidecar's hard cap on requests in flight to the engine (0: none).
	MaxInFlight int
	// Priority 0 carries the node's traffic by weight; priority 1 holds failover engines
	// that get no share but may be retried.
	Priority uint32
	// RTTMillis is the network round trip from this node to the engine; the sidecar takes
	// it out of observed latencies so a far engine is not mistaken for a slow one.
	RTTMillis float64
	// MetricsURL is the engine's Prometheus metrics (http:// or https://), which the
	// sidecar scrapes for the engine's queue; empty: the sidecar does not scrape it.
	MetricsURL string
}

// ClusterOptions shape a model cluster.
type ClusterOptions struct {
	ConnectTimeout time.Duration
	// RetryBudgetPercent is Envoy's retry_budget backstop: at most this share of active
	// requests may be retries. The sidecar's dynamic budget is tighter.
	RetryBudgetPercent  float64
	MinRetryConcurrency uint32
}

// DefaultClusterOptions are the options the control server uses unless configured.
func DefaultClusterOptions() ClusterOptions {
	return ClusterOptions{ConnectTimeout: time.Second, RetryBudgetPercent: 20, MinRetryConcurrency: 3}
}

// Cluster builds the CDS resource for model. Its endpoints come from EDS over ADS.
func Cluster(model string, opts ClusterOptions) (*clusterv3.Cluster, error) {
	fallback, err := anypb.New(&maglevv3.Maglev{})
	if err != nil {
		return nil, fmt.Errorf("encode maglev policy: %w", err)
	}
	override, err := anypb.New(&overridehostv3.OverrideHost{
		OverrideHostSources: []*overridehostv3.OverrideHost_OverrideHostSource{
			{Header: HeaderDestination},
			{Metadata: &metadatav3.MetadataKey{Key: MetadataNamespaceLB, Path: []*metadatav3.MetadataKey_PathSegment{
				{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: HeaderDestination}},
			}}},
		},
		FallbackPolicy: &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
			TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "envoy.load_balancing_policies.maglev", TypedConfig: fallback},
		}}},
	})
	if err != nil {
		return nil, fmt.Errorf("encode override_host policy: %w", err)
	}
	md, err := structpb.NewStruct(map[string]any{"model": model})
	if err != nil {
		return nil, fmt.Errorf("encode cluster metadata: %w", err)
	}
	name := ClusterName(model)
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig: &corev3.ConfigSource{
				ResourceApiVersion:    corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			},
		},
		ConnectTimeout: durationpb.New(opts.ConnectTimeout),
		LoadBalancingPolicy: &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
			TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "envoy.load_balancing_policies.override_host", TypedConfig: override},
		}}},
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			Priority:           corev3.RoutingPriority_DEFAULT,
			MaxRequests:        wrapperspb.UInt32(100000),
			MaxPendingRequests: wrapperspb.UInt32(100000),
			RetryBudget: &clusterv3.CircuitBreakers_Thresholds_RetryBudget{
				BudgetPercent:       &typev3.Percent{Value: opts.RetryBudgetPercent},
				MinRetryConcurrency: wrapperspb.UInt32(opts.MinRetryConcurrency),
			},
		}}},
		Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespaceEngine: md}},
	}, nil
}

// LoadAssignment builds the EDS resource for one model cluster as one node sees it.
// It refuses endpoints that Envoy would reject, so a bad assignment never reaches a cache.
func LoadAssignment(clusterName string, eps []Endpoint) (*endpointv3.ClusterLoadAssignment, error) {
	byPriority := map[uint32][]*endpointv3.LbEndpoint{}
	for _, ep := range eps {
		if ep.Weight < 1 {
			return nil, fmt.Errorf("cluster %s: engine %s: weight 0 is rejected by Envoy; leave the engine out instead", clusterName, ep.Engine)
		}
		ap, err := netip.ParseAddrPort(ep.Address)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: engine %s: address %q: %w", clusterName, ep.Engine, ep.Address, err)
		}
		fields := map[string]any{"engine": ep.Engine, "region": ep.Region, "max_in_flight": ep.MaxInFlight, "rtt_ms": ep.RTTMillis}
		if ep.MetricsURL != "" {
			if !validMetricsURL(ep.MetricsURL) {
				return nil, fmt.Errorf("cluster %s: engine %s: metrics URL %q: want an absolute http:// or https:// URL", clusterName, ep.Engine, ep.MetricsURL)
			}
			fields["metrics_url"] = ep.MetricsURL
		}
		md, err := structpb.NewStruct(fields)
		if err != nil {
			return nil, fmt.Errorf("encode endpoint metadata: %w", err)
		}
		health := corev3.HealthStatus_HEALTHY
		if ep.Draining {
			health = corev3.HealthStatus_DRAINING
		}
		byPriority[ep.Priority] = append(byPriority[ep.Priority], &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address:       ap.Addr().String(),
					PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(ap.Port())},
				}}},
			}},
			HealthStatus:        health,
			LoadBalancingWeight: wrapperspb.UInt32(ep.Weight),
			Metadata:            &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespaceEngine: md}},
		})
	}
	if len(byPriority[0]) == 0 && len(byPriority) > 0 {
		return nil, fmt.Errorf("cluster %s: failover engines but none at priority 0", clusterName)
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: clusterName}
	for p := uint32(0); len(cla.Endpoints) < len(byPriority); p++ {
		if lbs, ok := byPriority[p]; ok {
			// Envoy requires priorities to be contiguous from 0.
			if int(p) != len(cla.Endpoints) {
				return nil, fmt.Errorf("cluster %s: endpoint priorities skip %d", clusterName, len(cla.Endpoints))
			}
			cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{Priority: p, LbEndpoints: lbs})
		}
	}
	if len(cla.Endpoints) == 0 {
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{}}
	}
	return cla, nil
}

// validMetricsURL reports whether u is an absolute http(s) URL with a host.
func validMetricsURL(u string) bool {
	p, err := url.Parse(u)
	return err == nil && (p.Scheme == "http" || p.Scheme == "https") && p.Host != "" && p.User == nil
}

// RouteOptions shape the route table.
type RouteOptions struct {
	// Timeout bounds a whole request; long generations need minutes (Envoy's default is 15 s).
	Timeout time.Duration
	// IdleTimeout bounds the silence between two streamed chunks.
	IdleTimeout time.Duration
}

// DefaultRouteOptions fit long streamed generations.
func DefaultRouteOptions() RouteOptions {
	return RouteOptions{Timeout: 10 * time.Minute, IdleTimeout: 2 * time.Minute}
}

// RouteConfig routes a request to the cluster the sidecar named in HeaderCluster, and any
// other request (the sidecar failed open, or it did not classify the request) to the
// default model's cluster.
func RouteConfig(defaultModel string, opts RouteOptions) *routev3.RouteConfiguration {
	action := func(r *routev3.RouteAction) *routev3.Route_Route {
		r.Timeout = durationpb.New(opts.Timeout)
		r.IdleTimeout = durationpb.New(opts.IdleTimeout)
		r.HashPolicy = []*routev3.RouteAction_HashPolicy{{
			PolicySpecifier: &routev3.RouteAction_HashPolicy_Header_{Header: &routev3.RouteAction_HashPolicy_Header{HeaderName: HeaderPrefixHash}},
		}}
		return &routev3.Route_Route{Route: r}
	}
	return &routev3.RouteConfiguration{
		Name: RouteConfigName,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    "meridian",
			Domains: []string{"*"},
			Routes: []*routev3.Route{
				{
					Name: "steered",
					Match: &routev3.RouteMatch{
						PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"},
						Headers: []*routev3.HeaderMatcher{{
							Name:                 HeaderCluster,
							HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true},
						}},
					},
					Action: action(&routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_ClusterHeader{ClusterHeader: HeaderCluster}}),
				},
				{
					Name:   "default-model",
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: action(&routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: ClusterName(defaultModel)}}),
				},
			},
		}},
	}
}

// Validate runs the protos' own validation rules (the ones Envoy applies before it NACKs).
func Validate(msgs ...proto.Message) error {
	for _, m := range msgs {
		v, ok := m.(interface{ ValidateAll() error })
		if !ok {
			continue
		}
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("invalid %T: %w", m, err)
		}
	}
	return nil
}

// View is what one node routes on: for each model, its Envoy cluster and the endpoints
// of that node's assignment. It is immutable once handed out.
type View struct {
	// Version is the EDS version the view was built from.
	Version string
	// Models maps model name to its cluster and endpoints.
	Models map[string]ModelView
}

// ModelView is one model's cluster as one node sees it.
type ModelView struct {
	Name      string
	Cluster   string
	Endpoints []Endpoint
}
