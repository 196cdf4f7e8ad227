package xdsapi

import (
	"fmt"
	"net"
	"strconv"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
)

// ModelOf returns the model a cluster built by Cluster serves, or "" for other clusters.
func ModelOf(c *clusterv3.Cluster) string {
	md := c.GetMetadata().GetFilterMetadata()[MetadataNamespaceEngine]
	return md.GetFields()["model"].GetStringValue()
}

// EndpointsOf reads back what LoadAssignment encoded. Endpoints Envoy would not route to
// (unhealthy, timed out) are reported with their state so the caller can leave them out.
func EndpointsOf(cla *endpointv3.ClusterLoadAssignment) ([]Endpoint, error) {
	var out []Endpoint
	for _, loc := range cla.GetEndpoints() {
		for _, lb := range loc.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			if sa == nil {
				return nil, fmt.Errorf("cluster %s: endpoint without a socket address", cla.GetClusterName())
			}
			switch lb.GetHealthStatus() {
			case corev3.HealthStatus_UNHEALTHY, corev3.HealthStatus_TIMEOUT:
				continue
			}
			md := lb.GetMetadata().GetFilterMetadata()[MetadataNamespaceEngine].GetFields()
			w := lb.GetLoadBalancingWeight().GetValue()
			if w == 0 {
				w = 1 // EDS's own default when the field is absent
			}
			metrics := md["metrics_url"].GetStringValue()
			if metrics != "" && !validMetricsURL(metrics) {
				return nil, fmt.Errorf("cluster %s: endpoint %s: metrics_url %q is not an absolute http(s) URL", cla.GetClusterName(), md["engine"].GetStringValue(), metrics)
			}
			out = append(out, Endpoint{
				Engine:      md["engine"].GetStringValue(),
				Region:      md["region"].GetStringValue(),
				Address:     net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)),
				Weight:      w,
				Draining:    lb.GetHealthStatus() == corev3.HealthStatus_DRAINING,
				MaxInFlight: int(md["max_in_flight"].GetNumberValue()),
				Priority:    loc.GetPriority(),
				RTTMillis:   md["rtt_ms"].GetNumberValue(),
				MetricsURL:  metrics,
			})
		}
	}
	return out, nil
}
