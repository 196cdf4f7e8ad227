package kube_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/kube"
	"github.com/meridian-router/meridian/control/kube/kubetest"
)

const baseFleet = `
models:
  - {name: llama, capacity_rps: 8}
clusters:
  - {name: edge, region: us-east}
rtt_ms:
  edge: {us-east: 1, eu-west: 80}
discovery:
  kubernetes:
    namespace: %s
    zone_regions: {us-east-1a: us-east, eu-west-1b: eu-west}
    services:
      - {selector: "app=vllm", port: http, models: [llama]}
    inference_pools:
      - {selector: "", models: [llama], region: us-east}
`

// recorder runs a Discoverer whose apply merges with the base fleet, and keeps every fleet.
type recorder struct {
	mu       sync.Mutex
	fleets   []*fleet.Fleet
	problems []error
}

func (r *recorder) last() (*fleet.Fleet, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.fleets) == 0 {
		return nil, r.problems
	}
	return r.fleets[len(r.fleets)-1], r.problems
}

func (r *recorder) engines() map[string]fleet.Engine {
	f, _ := r.last()
	out := map[string]fleet.Engine{}
	if f != nil {
		for _, e := range f.Engines {
			out[e.Name] = e
		}
	}
	return out
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startDiscoverer(t *testing.T, ctx context.Context, rc *rest.Config, ns string) (*recorder, *kube.Metrics, prometheus.Gatherer, *syncBuf) {
	t.Helper()
	base, err := fleet.Parse("fleet.yaml", []byte(fmt.Sprintf(baseFleet, ns)))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := kube.NewMetrics(reg)
	logs := &syncBuf{}
	d, err := kube.New(kube.Options{Config: *base.Discovery.Kubernetes, Models: base.Models, REST: rc,
		Log: slog.New(slog.NewTextHandler(logs, nil)), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	go d.Run(ctx, func(found []fleet.Discovered) []error {
		f, problems := base.WithDiscovered(found)
		r.mu.Lock()
		defer r.mu.Unlock()
		if f != nil {
			r.fleets = append(r.fleets, f)
		}
		r.problems = problems
		return problems
	})
	return r, m, reg, logs
}

func namespace(t *testing.T, ctx context.Context, c kubernetes.Interface, name string) {
	t.Helper()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// slice is an EndpointSlice of Service "llama" with n endpoints 10.1.0.1.. in zone us-east-1a.
func slice(ns, name string, n int, notReady ...int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "vllm", discoveryv1.LabelServiceName: "llama"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8000)}, {Name: ptr.To("metrics"), Port: ptr.To[int32](9000)}},
	}
	for i := 0; i < n; i++ {
		ready := true
		for _, j := range notReady {
			ready = ready && i != j
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.1.0.%d", i+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)},
			Zone:       ptr.To("us-east-1a"),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("llama-%d", i)},
		})
	}
	return s
}

func keys(m map[string]fleet.Engine) string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// TestK8sDiscoveryServices: EndpointSlices selected by label become engines, scale-ups and
// downs follow, a not-ready or terminating endpoint drains, and the watch survives a
// restart of the API server without losing the fleet.
func TestK8sDiscoveryServices(t *testing.T) {
	env := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "svc"
	namespace(t, ctx, env.Client, ns)
	slices := env.Client.DiscoveryV1().EndpointSlices(ns)
	if _, err := slices.Create(ctx, slice(ns, "llama-abc", 3), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Not selected: another label.
	other := slice(ns, "other", 2)
	other.Labels["app"] = "web"
	for i := range other.Endpoints {
		other.Endpoints[i].Addresses[0] = fmt.Sprintf("10.9.0.%d", i+1)
	}
	if _, err := slices.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, _, _, _ := startDiscoverer(t, ctx, env.Config, ns)
	if _, ok := kubetest.WaitFor(ctx, 20*time.Second, func() bool { return len(r.engines()) == 3 }); !ok {
		t.Fatalf("discovered %v, want the 3 endpoints of llama-abc", keys(r.engines()))
	}
	e := r.engines()["svc/llama/llama-0"]
	want := fleet.Engine{Name: "svc/llama/llama-0", Address: "10.1.0.1:8000", Region: "us-east", Models: []string{"llama"},
		CapacityRPS: 8, MetricsURL: "http://10.1.0.1:8000/metrics"}
	if fmt.Sprint(e) != fmt.Sprint(want) {
		t.Fatalf("engine = %+v\nwant     %+v (address from the endpoint and the port named http, region from the zone, capacity from the model)", e, want)
	}

	// Scale 3 -> 5 -> 2: each reaches the fleet; the time from the update to the new fleet
	// is logged (docs/kubernetes.md quotes it).
	for _, n := range []int{5, 2} {
		cur, err := slices.Get(ctx, "llama-abc", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Endpoints = slice(ns, "llama-abc", n).Endpoints
		if _, err := slices.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		took, ok := kubetest.WaitFor(ctx, 20*time.Second, func() bool { return len(r.engines()) == n })
		if !ok {
			t.Fatalf("after scaling to %d: engines %v", n, keys(r.engines()))
		}
		t.Logf("scale to %d reached the fleet in %s", n, took.Round(time.Millisecond))
	}

	// Endpoint 1 not ready, a new endpoint 2 terminating: both drain, endpoint 0 does not.
	cur, _ := slices.Get(ctx, "llama-abc", metav1.GetOptions{})
	cur.Endpoints = slice(ns, "llama-abc", 3, 1).Endpoints
	cur.Endpoints[2].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	if _, err := slices.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := kubetest.WaitFor(ctx, 20*time.Second, func() bool {
		es := r.engines()
		return len(es) == 3 && !es["svc/llama/llama-0"].Draining && es["svc/llama/llama-1"].Draining && es["svc/llama/llama-2"].Draining
	}); !ok {
		t.Fatalf("want llama-1 (not ready) and llama-2 (terminating) draining, llama-0 not: %+v", r.engines())
	}

	// The API server goes away: the last fleet stays; when it is back the watch resumes.
	r.mu.Lock()
	before := len(r.fleets)
	r.mu.Unlock()
	env.RestartAPIServer(t, func() {
		time.Sleep(2 * time.Second)
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.fleets) != before {
			t.Errorf("a fleet was delivered while the API server was down: %+v", r.fleets[len(r.fleets)-1].Engines)
		}
	})
	if got := keys(r.engines()); got != "svc/llama/llama-0,svc/llama/llama-1,svc/llama/llama-2" {
		t.Fatalf("after the API server restart: engines %s, want the last good three", got)
	}
	admin, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	var createErr error
	if _, ok := kubetest.WaitFor(ctx, 30*time.Second, func() bool {
		_, createErr = admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, func() *discoveryv1.EndpointSlice {
			s := slice(ns, "llama-def", 1)
			s.Endpoints[0].Addresses[0] = "10.1.1.1"
			s.Endpoints[0].TargetRef.Name = "llama-new"
			return s
		}(), metav1.CreateOptions{})
		return createErr == nil
	}); !ok {
		t.Fatalf("the restarted API server takes no writes: %v", createErr)
	}
	if _, ok := kubetest.WaitFor(ctx, 30*time.Second, func() bool { _, ok := r.engines()["svc/llama/llama-new"]; return ok }); !ok {
		t.Fatalf("the watch did not resume after the API server restart: engines %v", keys(r.engines()))
	}
}

// TestK8sDiscoveryBadObjectIsSkippedAndReported: an object with a bad annotation or an
// unknown zone is left out and gets a Warning Event naming the field; the rest is served.
func TestK8sDiscoveryBadObjectIsSkippedAndReported(t *testing.T) {
	env := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "bad"
	namespace(t, ctx, env.Client, ns)
	slices := env.Client.DiscoveryV1().EndpointSlices(ns)
	good := slice(ns, "good", 2)
	badCap := slice(ns, "bad-capacity", 1)
	badCap.Endpoints[0].Addresses[0] = "10.2.0.1"
	badCap.Endpoints[0].TargetRef.Name = "cap-0"
	badCap.Annotations = map[string]string{kube.AnnotationCapacity: "lots"}
	badZone := slice(ns, "bad-zone", 1)
	badZone.Endpoints[0].Addresses[0] = "10.3.0.1"
	badZone.Endpoints[0].TargetRef.Name = "zone-0"
	badZone.Endpoints[0].Zone = ptr.To("ap-south-1a")
	for _, s := range []*discoveryv1.EndpointSlice{good, badCap, badZone} {
		if _, err := slices.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r, _, reg, logs := startDiscoverer(t, ctx, env.Config, ns)
	if _, ok := kubetest.WaitFor(ctx, 20*time.Second, func() bool { return len(r.engines()) == 2 }); !ok {
		t.Fatalf("engines %v, want the two good ones", keys(r.engines()))
	}
	wantEvents := map[string]string{
		"bad-capacity": `metadata.annotations[meridian.dev/capacity-rps]: "lots" is not a finite number > 0`,
		"bad-zone":     `endpoints[0].zone (zone "ap-south-1a" is not in discovery.kubernetes.zone_regions): is required`,
	}
	for obj, want := range wantEvents {
		var msgs []string
		if _, ok := kubetest.WaitFor(ctx, 20*time.Second, func() bool {
			evs, err := env.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + obj})
			if err != nil {
				return false
			}
			msgs = msgs[:0]
			for _, e := range evs.Items {
				msgs = append(msgs, e.Reason+": "+e.Message)
				if e.Type == corev1.EventTypeWarning && e.Reason == "EngineRejected" && e.InvolvedObject.Kind == "EndpointSlice" && strings.Contains(e.Message, want) {
					return true
				}
			}
			return false
		}); !ok {
			t.Errorf("no Warning Event on EndpointSlice %s/%s saying %q; events: %q", ns, obj, want, msgs)
		}
	}
	if got := gauge(t, reg, "meridian_control_discovery_rejected_objects"); got != 2 {
		t.Errorf("rejected objects = %v, want 2", got)
	}
	if !strings.Contains(logs.String(), "EndpointSlice bad/bad-capacity") {
		t.Errorf("the log does not name the left-out object:\n%s", logs)
	}
	// Fixing the object brings its engine in and clears the report.
	cur, _ := slices.Get(ctx, "bad-capacity", metav1.GetOptions{})
	cur.Annotations[kube.AnnotationCapacity] = "12.5"
	if _, err := slices.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := kubetest.WaitFor(ctx, 20*time.Second, func() bool { return r.engines()["bad/llama/cap-0"].CapacityRPS == 12.5 && len(r.engines()) == 3 }); !ok {
		t.Fatalf("fixed object not taken (want bad/llama/cap-0 at 12.5 rps): %+v", r.engines())
	}
	if got := gauge(t, reg, "meridian_control_discovery_rejected_objects"); got != 1 {
		t.Errorf("rejected objects after the fix = %v, want 1", got)
	}
}

func gauge(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			sum := 0.0
			for _, m := range mf.GetMetric() {
				if m.GetGauge() != nil {
					sum += m.GetGauge().GetValue()
				}
				if m.GetCounter() != nil {
					sum += m.GetCounter().GetValue()
				}
			}
			return sum
		}
	}
	return 0
}

// TestK8sDiscoveryInferencePool: an InferencePool's ready member pods are engines, one per
// target port; a pod turned not ready drains, and models/capacity come from annotations.
func TestK8sDiscoveryInferencePool(t *testing.T) {
	env := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "pool"
	namespace(t, ctx, env.Client, ns)
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "llama", "namespace": ns, "annotations": map[string]any{kube.AnnotationCapacity: "6"}},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "llama"}},
			"targetPorts":       []any{map[string]any{"number": int64(8000)}, map[string]any{"number": int64(8001)}},
			"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	if _, err := dyn.Resource(kube.PoolResource).Namespace(ns).Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create InferencePool (is the CRD installed?): %v", err)
	}
	for i, ip := range []string{"10.4.0.1", "10.4.0.2"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("llama-%d", i), Namespace: ns, Labels: map[string]string{"app": "llama"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}},
		}
		if i == 1 {
			pod.Annotations = map[string]string{kube.AnnotationCapacity: "20"}
		}
		created, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := env.Client.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A pod that does not match the selector.
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, _, _, _ := startDiscoverer(t, ctx, env.Config, ns)
	want := "pool/llama/llama-0:8000,pool/llama/llama-0:8001,pool/llama/llama-1:8000,pool/llama/llama-1:8001"
	if _, ok := kubetest.WaitFor(ctx, 20*time.Second, func() bool { return keys(r.engines()) == want }); !ok {
		_, problems := r.last()
		t.Fatalf("engines %v, want %s (problems %v)", keys(r.engines()), want, problems)
	}
	es := r.engines()
	if e := es["pool/llama/llama-0:8001"]; e.Address != "10.4.0.1:8001" || e.CapacityRPS != 6 || e.Region != "us-east" || e.Draining {
		t.Errorf("llama-0:8001 = %+v: want 10.4.0.1:8001, capacity 6 from the pool's annotation, region us-east", e)
	}
	if e := es["pool/llama/llama-1:8000"]; e.CapacityRPS != 20 {
		t.Errorf("llama-1:8000 capacity = %v, want 20 from the pod's annotation", e.CapacityRPS)
	}
	// Pod 1 turns not ready: both its engines drain.
	p1, _ := env.Client.CoreV1().Pods(ns).Get(ctx, "llama-1", metav1.GetOptions{})
	p1.Status.Conditions[0].Status = corev1.ConditionFalse
	if _, err := env.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := kubetest.WaitFor(ctx, 20*time.Second, func() bool {
		es := r.engines()
		return es["pool/llama/llama-1:8000"].Draining && es["pool/llama/llama-1:8001"].Draining && !es["pool/llama/llama-0:8000"].Draining
	}); !ok {
		t.Fatalf("not-ready pod does not drain: %+v", r.engines())
	}
	// Pod 0 is deleted: its engines leave the fleet.
	if err := env.Client.CoreV1().Pods(ns).Delete(ctx, "llama-0", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if _, ok := kubetest.WaitFor(ctx, 20*time.Second, func() bool { return keys(r.engines()) == "pool/llama/llama-1:8000,pool/llama/llama-1:8001" }); !ok {
		t.Fatalf("after deleting llama-0: engines %v", keys(r.engines()))
	}
}

// TestK8sDiscoveryRBACDenied: a service account without list on endpointslices gets a log
// line and a metric naming the missing permission; granting it starts discovery.
func TestK8sDiscoveryRBACDenied(t *testing.T) {
	env := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "rbac"
	namespace(t, ctx, env.Client, ns)
	if _, err := env.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice(ns, "llama-abc", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	user := env.User(t, "meridian-control")
	base, _ := fleet.Parse("fleet.yaml", []byte(fmt.Sprintf(baseFleet, ns)))
	cfg := *base.Discovery.Kubernetes
	cfg.InferencePools = nil
	reg := prometheus.NewRegistry()
	logs := &syncBuf{}
	d, err := kube.New(kube.Options{Config: cfg, Models: base.Models, REST: user, Log: slog.New(slog.NewTextHandler(logs, nil)), Metrics: kube.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	go d.Run(ctx, func(found []fleet.Discovered) []error {
		f, problems := base.WithDiscovered(found)
		r.mu.Lock()
		r.fleets = append(r.fleets, f)
		r.mu.Unlock()
		return problems
	})
	if _, ok := kubetest.WaitFor(ctx, 20*time.Second, func() bool {
		return strings.Contains(logs.String(), `missing="list endpointslices (API group discovery.k8s.io) in namespace rbac"`)
	}); !ok {
		t.Fatalf("no log line naming the missing permission:\n%s", logs)
	}
	if got := testutil.ToFloat64(forbidden(t, reg)); got < 1 {
		t.Fatalf("forbidden metric = %v", got)
	}
	// Grant the Role the chart grants: discovery starts.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "meridian-control", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}}}}
	if _, err := env.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "meridian-control", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "meridian-control"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "meridian-control"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := kubetest.WaitFor(ctx, 60*time.Second, func() bool { return len(r.engines()) == 1 }); !ok {
		t.Fatalf("granted, but no engine discovered: %v\n%s", keys(r.engines()), logs)
	}
}

// forbidden returns the one series of the forbidden counter, asserting its labels.
func forbidden(t *testing.T, g prometheus.Gatherer) prometheus.Collector {
	t.Helper()
	mfs, _ := g.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "meridian_control_discovery_forbidden_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["verb"] == "list" && l["resource"] == "endpointslices" && l["group"] == "discovery.k8s.io" && l["namespace"] == "rbac" {
				return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x"}, func() float64 { return m.GetCounter().GetValue() })
			}
			t.Logf("forbidden series %v", l)
		}
	}
	t.Fatal("no meridian_control_discovery_forbidden_total{verb=list,resource=endpointslices,group=discovery.k8s.io,namespace=rbac}")
	return nil
}
