// Package deploy holds the Helm chart (deploy/meridian); its tests render and lint it with
// the real helm (scripts/k8s-tools.sh builds it) and apply it to a real API server.
package deploy

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/meridian-router/meridian/bootstrap"
	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/kube"
	"github.com/meridian-router/meridian/control/kube/kubetest"
	"github.com/meridian-router/meridian/control/leader"
)

const chart = "meridian"

func helm(t *testing.T) string {
	t.Helper()
	dir, err := kubetest.AssetsDir()
	if err == nil {
		p := filepath.Join(dir, "helm")
		if _, err = os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and no helm: %v (scripts/k8s-tools.sh builds it)", err)
	}
	t.Skipf("no helm: %v (run scripts/k8s-tools.sh)", err)
	return ""
}

func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	var out, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return out.String()
}

// withPools turns on InferencePool discovery and the ServiceMonitor.
const withPools = `
fleet:
  discovery:
    kubernetes:
      inference_pools:
        - {selector: "", models: [llama-3-8b], region: us-east}
serviceMonitor:
  enabled: true
`

func valuesFile(t *testing.T, content string) string {
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestChartLints(t *testing.T) {
	h := helm(t)
	run(t, h, "lint", "--strict", chart)
	run(t, h, "lint", "--strict", chart, "-f", valuesFile(t, withPools))
}

var update = flag.Bool("update", false, "rewrite the chart's rendered bootstrap files (deploy/meridian/files)")

// The paths the chart mounts the envoy Secret and the bootstrap ConfigMap at.
const (
	envoyTLSDir = "/etc/envoy-tls"
	envoySDSDir = "/etc/envoy"
)

// chartBootstrap renders what files/ must hold: the bootstrap with mutual TLS (the
// default), its two SDS files, and the plaintext one for tls.insecure=true.
func chartBootstrap(t *testing.T) map[string][]byte {
	t.Helper()
	p := bootstrap.DefaultParams()
	p.NodeID, p.Listen, p.Admin, p.XDS, p.Sidecar, p.AccessLogPath = "meridian-node-id-placeholder", "0.0.0.0:10000", "127.0.0.1:9901",
		"meridian-xds-placeholder:18000", "127.0.0.1:19001", "/dev/stdout"
	out := map[string][]byte{}
	insecure := p
	insecure.Insecure = true
	var b bytes.Buffer
	if err := bootstrap.Render(&b, insecure); err != nil {
		t.Fatal(err)
	}
	out["envoy-insecure.yaml"] = bytes.Clone(b.Bytes())

	p.TLS = &bootstrap.TLSFiles{Cert: envoyTLSDir + "/tls.crt", Key: envoyTLSDir + "/tls.key", CA: envoyTLSDir + "/ca.crt", SDSDir: envoySDSDir}
	b.Reset()
	if err := bootstrap.Render(&b, p); err != nil {
		t.Fatal(err)
	}
	out["envoy.yaml"] = bytes.Clone(b.Bytes())
	// The SDS files name only the Secret's paths, not where they are written.
	sds := t.TempDir()
	p.TLS.SDSDir = sds
	if err := bootstrap.WriteSDS(p); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"cert", "ca"} {
		data, err := os.ReadFile(filepath.Join(sds, "envoy-meridian-node-id-placeholder-"+kind+".sds.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		out["envoy-"+kind+".sds.yaml"] = data
	}
	return out
}

// TestChartBootstrapIsRendered: the chart's Envoy bootstrap files are meridian-bootstrap's
// output for the chart's parameters (regenerate with go test ./deploy -run
// TestChartBootstrapIsRendered -update).
func TestChartBootstrapIsRendered(t *testing.T) {
	for name, want := range chartBootstrap(t) {
		path := filepath.Join(chart, "files", name)
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/meridian/files/%s is stale: regenerate it with go test ./deploy -run TestChartBootstrapIsRendered -update", name)
		}
	}
}

func docs(t *testing.T, rendered string) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(rendered), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		if len(obj) > 0 {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// TestK8sChartApplies renders the chart, applies it to a real API server (server-side
// apply), checks the fleet file it carries is valid, and runs discovery and leader
// election as the chart's service account: its RBAC is enough, and no more is granted.
// With the TLS default, the Secrets come from meridian-certs; each proves its process's
// identity, and the control and sidecar containers, run as processes with the mounts laid
// out as a kubelet would, connect over mutual TLS.
func TestK8sChartApplies(t *testing.T) {
	h := helm(t)
	env := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := "meridian"
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The ServiceMonitor's CRD is not on this API server: leave it out here (lint covers it).
	values := strings.Replace(withPools, "enabled: true", "enabled: false", 1)
	// The default is mutual TLS: the Secrets it mounts come from meridian-certs, as the
	// chart's NOTES say.
	r := render(t, h, values)
	secrets := certSecrets(t, "r1-meridian", "gateway")
	for _, s := range secrets {
		s.SetNamespace(ns)
	}
	objs := append(secrets, r.objs...)

	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, o.GetName(), err)
		}
		data, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(m.Resource).Namespace(o.GetNamespace()).Patch(ctx, o.GetName(), types.ApplyPatchType, data,
			metav1.PatchOptions{FieldManager: "meridian-chart-test", Force: ptrTo(true)}); err != nil {
			t.Errorf("server-side apply of %s %s/%s rejected: %v", gvk.Kind, o.GetNamespace(), o.GetName(), err)
		}
		kinds[gvk.Kind]++
	}
	for _, k := range []string{"Deployment", "PodDisruptionBudget", "Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "NetworkPolicy", "Secret"} {
		if kinds[k] == 0 {
			t.Errorf("the chart renders no %s", k)
		}
	}

	// The control Deployment: 2 replicas, probes on /healthz, resources, anti-affinity.
	dep, err := env.Client.AppsV1().Deployments(ns).Get(ctx, "r1-meridian-control", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if *dep.Spec.Replicas != 2 || c.ReadinessProbe.HTTPGet.Path != "/healthz" || c.LivenessProbe.HTTPGet.Path != "/healthz" ||
		c.Resources.Requests.Cpu().IsZero() || dep.Spec.Template.Spec.Affinity.PodAntiAffinity == nil || !slices.Contains(c.Args, "--leader-elect") {
		t.Errorf("control Deployment lacks replicas/probes/resources/anti-affinity/leader election: %+v", dep.Spec)
	}

	// Each TLS Secret the chart mounts is on the API server and proves the identity of the
	// process that mounts it.
	chartSecretsProve(t, ctx, env, ns, r)

	// The fleet file in the ConfigMap is a valid fleet file.
	cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(ctx, "r1-meridian-fleet", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base, err := fleet.Parse("fleet.yaml", []byte(cm.Data["fleet.yaml"]))
	if err != nil {
		t.Fatalf("the chart's fleet file is invalid: %v", err)
	}

	// Least privilege: only read verbs on what discovery reads, create on events, and the
	// Lease; nothing cluster-wide.
	roles, _ := env.Client.RbacV1().Roles(ns).List(ctx, metav1.ListOptions{})
	for _, r := range roles.Items {
		for _, rule := range r.Rules {
			for _, v := range rule.Verbs {
				if !slices.Contains([]string{"get", "list", "watch", "create", "update"}, v) {
					t.Errorf("Role %s grants %q on %v", r.Name, v, rule.Resources)
				}
			}
			for _, res := range rule.Resources {
				if !slices.Contains([]string{"endpointslices", "inferencepools", "pods", "events", "leases"}, res) {
					t.Errorf("Role %s grants access to %q", r.Name, res)
				}
			}
			if slices.Contains(rule.Verbs, "update") && len(rule.ResourceNames) == 0 {
				t.Errorf("Role %s grants update on %v without naming the Lease", r.Name, rule.Resources)
			}
		}
	}
	if crs, _ := env.Client.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meridian"}); len(crs.Items) > 0 {
		t.Errorf("the chart creates ClusterRoles: %v", crs.Items)
	}

	// As the chart's service account: discovery syncs without a refusal, and the Lease is
	// acquired.
	sa := rest.CopyConfig(env.Config)
	sa.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":r1-meridian-control"}
	reg := prometheus.NewRegistry()
	m := kube.NewMetrics(reg)
	var buf bytes.Buffer
	logs := &syncWriter{w: &buf}
	log := slog.New(slog.NewTextHandler(logs, nil))
	d, err := kube.New(kube.Options{Config: *base.Discovery.Kubernetes, Models: base.Models, REST: sa, Log: log, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	synced := make(chan struct{}, 1)
	dctx, stop := context.WithCancel(ctx)
	defer stop()
	go d.Run(dctx, func([]fleet.Discovered) []error {
		select {
		case synced <- struct{}{}:
		default:
		}
		return nil
	})
	select {
	case <-synced:
	case <-time.After(30 * time.Second):
		t.Fatalf("discovery as the chart's service account did not sync; log:\n%s", logs.String())
	}
	// The Event permission: a left-out object's Event is recorded.
	if _, err := kubernetes.NewForConfigOrDie(sa).CoreV1().Events(ns).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe."},
		InvolvedObject: corev1.ObjectReference{Kind: "ConfigMap", Namespace: ns, Name: "r1-meridian-fleet"}, Reason: "Probe", Message: "probe", Type: "Normal"}, metav1.CreateOptions{}); err != nil {
		t.Errorf("the chart's service account cannot record Events: %v", err)
	}
	lctx, lstop := context.WithCancel(ctx)
	led := make(chan struct{})
	go leader.Run(lctx, leader.Config{Client: kubernetes.NewForConfigOrDie(sa), Namespace: ns, Name: "r1-meridian-control", Identity: "test",
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond, Log: log},
		func(ctx context.Context) { close(led); <-ctx.Done() }, func(string) {})
	select {
	case <-led:
	case <-time.After(30 * time.Second):
		t.Fatalf("the chart's service account could not acquire the Lease; log:\n%s", logs.String())
	}
	lstop()
	if n := testutil.CollectAndCount(reg, "meridian_control_discovery_forbidden_total"); n != 0 {
		t.Errorf("RBAC refused %d requests of the chart's service account; log:\n%s", n, logs.String())
	}
	// What the chart does not grant is refused: listing Secrets.
	if _, err := kubernetes.NewForConfigOrDie(sa).CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("the chart's service account may list Secrets")
	}

	// The chart's control and sidecar containers run (after the Lease above is free again).
	// An engine for the fleet (the chart's Service source): its address is not reachable,
	// which the control server reports and serves around.
	if _, err := env.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "llama-x1", Namespace: ns, Labels: map[string]string{"meridian.dev/engine": "true", discoveryv1.LabelServiceName: "llama"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo[int32](8000)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.20.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runChartPods(t, ctx, env, ns, r)
}

func ptrTo[T any](v T) *T { return &v }

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.(*bytes.Buffer).String()
}
