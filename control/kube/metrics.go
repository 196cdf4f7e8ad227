package kube

import (
	"errors"
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Metrics are the discovery metrics of one process.
type Metrics struct {
	rejected   prometheus.Gauge
	rejections prometheus.Counter
	forbidden  *prometheus.CounterVec
	watchErrs  *prometheus.CounterVec
	// modelProbes counts GET /v1/models requests to engines whose objects name no models.
	modelProbes *prometheus.CounterVec
}

// NewMetrics registers the discovery metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rejected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_control_discovery_rejected_objects",
			Help: "Kubernetes objects whose engines are left out of the fleet now (each reported in the log and as an Event)."}),
		rejections: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_control_discovery_rejections_total",
			Help: "Times a Kubernetes object was left out of the fleet, or left out for a new reason."}),
		forbidden: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_control_discovery_forbidden_total",
			Help: "API requests RBAC refused, by the permission missing: grant verb on resource (group) in namespace."},
			[]string{"verb", "resource", "group", "namespace"}),
		watchErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_control_discovery_watch_errors_total",
			Help: "Failed list or watch calls to the API server, by resource (the informer retries with backoff)."},
			[]string{"resource"}),
		modelProbes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_control_discovery_model_requests_total",
			Help: "GET /v1/models requests to discovered engines whose objects name no models, by result (ok, error)."},
			[]string{"result"}),
	}
	reg.MustRegister(m.rejected, m.rejections, m.forbidden, m.watchErrs, m.modelProbes)
	return m
}

// forbiddenRE reads the API server's RBAC message:
// `User "x" cannot list resource "pods" in API group "" in the namespace "y"`.
var forbiddenRE = regexp.MustCompile(`cannot (\w+) resource "([^"]+)" in API group "([^"]*)"(?: in the namespace "([^"]+)")?`)

// watchError counts a failed API call and, when RBAC refused it, logs and counts which
// permission is missing.
func (d *Discoverer) watchError(resource string, err error) {
	d.opt.Metrics.watchErrs.WithLabelValues(resource).Inc()
	if !apierrors.IsForbidden(err) {
		return
	}
	verb, res, group, ns := "list", resource, "", d.opt.Config.Namespace
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		if m := forbiddenRE.FindStringSubmatch(st.Status().Message); m != nil {
			verb, res, group, ns = m[1], m[2], m[3], m[4]
		}
	}
	scope := "in namespace " + ns
	if ns == "" {
		scope = "cluster-wide"
	}
	d.opt.Metrics.forbidden.WithLabelValues(verb, res, group, ns).Inc()
	d.opt.Log.Error("kubernetes discovery: RBAC refused a request; grant the permission to meridian-control's service account",
		"verb", verb, "resource", res, "group", group, "namespace", ns, "missing", verb+" "+res+" ("+groupName(group)+") "+scope, "err", err)
}

func groupName(g string) string {
	if g == "" {
		return "core API group"
	}
	return "API group " + g
}
