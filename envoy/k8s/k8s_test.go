// Package k8s tests meridian on a real kube-apiserver and etcd with a real Envoy, real
// sidecars and mock engines: engines discovered from the cluster reach Envoy's EDS, and a
// leader-elected control plane fails over under load.
package k8s

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/kube"
	"github.com/meridian-router/meridian/control/kube/kubetest"
	"github.com/meridian-router/meridian/envoy/stack"
	"github.com/meridian-router/meridian/mtls"
)

const model = "m"

var binaries = sync.OnceValues(func() (stack.Binaries, error) {
	dir, err := os.MkdirTemp("", "meridian-k8s-bin-")
	if err != nil {
		return stack.Binaries{}, err
	}
	return stack.Build(dir)
})

func startStack(t *testing.T, spec stack.Spec) *stack.Stack {
	t.Helper()
	stack.RequireEnvoy(t)
	bins, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	return stack.StartT(t, bins, spec)
}

func engines(n int) []stack.EngineSpec {
	var out []stack.EngineSpec
	for i := 0; i < n; i++ {
		out = append(out, stack.EngineSpec{Name: fmt.Sprintf("e%d", i), Region: "a", Models: []string{model}, CapacityRPS: 50,
			Args: []string{"--ttft", "20ms", "--itl", "2ms"}})
	}
	return out
}

// chat sends one small completion and returns the status and the engine that served.
func chat(ctx context.Context, url string, i int) (int, string, error) {
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"request ` + strconv.Itoa(i) + `"}],"max_tokens":4}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Served-By"), err
}

func hosts(t *testing.T, ctx context.Context, s *stack.Stack) map[string]uint32 {
	ws, err := s.EnvoyWeights(ctx, "region-a")
	if err != nil {
		return nil
	}
	return ws["model-"+model]
}

// members is every host of the model's cluster in Envoy's EDS, at any priority: what
// discovery put there, whether or not the plan gives it a share.
func members(t *testing.T, ctx context.Context, s *stack.Stack) map[string]uint32 {
	ws, err := s.EnvoyMembers(ctx, "region-a")
	if err != nil {
		return nil
	}
	return ws["model-"+model]
}

func sortedKeys(m map[string]uint32) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// readyPod creates the pod llama-0 (label app=llama, the pool's selector) on 127.0.0.1 and
// marks it running and ready, as a kubelet would.
func readyPod(ctx context.Context, t *testing.T, client kubernetes.Interface, ns string) {
	t.Helper()
	pod, err := client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llama-0", Namespace: ns, Labels: map[string]string{"app": "llama"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func pool(ns string, ports []int) *unstructured.Unstructured {
	var tp []any
	for _, p := range ports {
		tp = append(tp, map[string]any{"number": int64(p)})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "llama", "namespace": ns},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "llama"}},
			"targetPorts":       tp,
			"endpointPickerRef": map[string]any{"name": "meridian", "port": map[string]any{"number": int64(9002)}},
		},
	}}
}

func port(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	p, _ := strconv.Atoi(addr[i+1:])
	return p
}

// TestK8sEnvoyDiscovery: an InferencePool (one pod at 127.0.0.1, its target ports the mock
// engines) and a Service's EndpointSlice are discovered; Envoy's EDS gets exactly those
// endpoints and routes to them; scaling 3 -> 5 -> 2 reaches Envoy's EDS, timed.
func TestK8sEnvoyDiscovery(t *testing.T) {
	env := kubetest.Start(t)
	kubeconfig := kubetest.Kubeconfig(t, env.Config)
	s := startStack(t, stack.Spec{Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}}, Engines: engines(5)})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	ns := "llm"
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var addrs []string // e0..e4
	for i := 0; i < 5; i++ {
		addrs = append(addrs, s.Engines[fmt.Sprintf("e%d", i)].Address)
	}
	ports := func(n int) []int {
		var out []int
		for _, a := range addrs[:n] {
			out = append(out, port(a))
		}
		return out
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	pools := dyn.Resource(kube.PoolResource).Namespace(ns)
	if _, err := pools.Create(ctx, pool(ns, ports(3)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	readyPod(ctx, t, env.Client, ns)

	// The fleet file keeps models, clusters and RTTs; its engines now come from the cluster.
	if err := s.EditFleet(func(f *fleet.Fleet) {
		f.Engines = nil
		f.Discovery = &fleet.Discovery{Kubernetes: &fleet.KubernetesDiscovery{
			Kubeconfig: kubeconfig, Namespace: ns,
			InferencePools: []fleet.PoolSource{{EngineDefaults: fleet.EngineDefaults{Models: []string{model}, Region: "a", CapacityRPS: 50}}},
			Services:       []fleet.ServiceSource{{Selector: "app=vllm", Port: "http", EngineDefaults: fleet.EngineDefaults{Models: []string{model}, Region: "a", CapacityRPS: 50}}},
		}}
	}); err != nil {
		t.Fatal(err)
	}
	want := func(as ...string) string { sort.Strings(as); return strings.Join(as, ",") }
	if _, ok := kubetest.WaitFor(ctx, 60*time.Second, func() bool { return want(sortedKeys(members(t, ctx, s))...) == want(addrs[:3]...) }); !ok {
		t.Fatalf("Envoy's EDS has %v, want the pool's three endpoints %v", sortedKeys(members(t, ctx, s)), addrs[:3])
	}
	served := map[string]int{}
	for i := 0; i < 30; i++ {
		code, by, err := chat(ctx, s.Nodes["region-a"].URL, i)
		if err != nil || code != 200 {
			t.Fatalf("request %d: %d %v", i, code, err)
		}
		served[by]++
	}
	for by := range served {
		if by != "e0" && by != "e1" && by != "e2" {
			t.Fatalf("served by %q, which is not in the pool (served: %v)", by, served)
		}
	}
	t.Logf("30 requests through Envoy to the discovered engines: %v", served)

	// Scale the pool 3 -> 5 -> 2: time from the API write to Envoy's EDS.
	var took []time.Duration
	for _, n := range []int{5, 2, 4, 3} {
		cur, err := pools.Get(ctx, "llama", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var tp []any
		for _, p := range ports(n) {
			tp = append(tp, map[string]any{"number": int64(p)})
		}
		_ = unstructured.SetNestedSlice(cur.Object, tp, "spec", "targetPorts")
		start := time.Now()
		if _, err := pools.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := kubetest.WaitFor(ctx, 30*time.Second, func() bool { return want(sortedKeys(members(t, ctx, s))...) == want(addrs[:n]...) }); !ok {
			t.Fatalf("after scaling to %d: Envoy's EDS has %v", n, sortedKeys(members(t, ctx, s)))
		}
		took = append(took, time.Since(start))
		t.Logf("scale to %d: in Envoy's EDS %s after the API write", n, time.Since(start).Round(time.Millisecond))
	}

	// A Service's EndpointSlice (addresses may not be loopback in a slice: these engines
	// are not reachable, but reach EDS all the same).
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-x1", Namespace: ns, Labels: map[string]string{"app": "vllm", discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8000)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.20.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.20.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		},
	}
	start := time.Now()
	if _, err := env.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := kubetest.WaitFor(ctx, 30*time.Second, func() bool {
		h := members(t, ctx, s)
		_, a := h["10.20.0.1:8000"]
		_, b := h["10.20.0.2:8000"]
		return a && b
	}); !ok {
		t.Fatalf("the EndpointSlice's endpoints are not in Envoy's EDS: %v", sortedKeys(members(t, ctx, s)))
	}
	took = append(took, time.Since(start))
	t.Logf("EndpointSlice: in Envoy's EDS %s after the API write", time.Since(start).Round(time.Millisecond))
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("API write -> Envoy EDS over %d changes: median %s, max %s", len(took), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
}

// envoyConnected reads Envoy's control_plane.connected_state (1: an ADS stream is up).
func envoyConnected(ctx context.Context, admin string) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, admin+"/stats?filter=^control_plane.connected_state$", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), "control_plane.connected_state: 1")
}

func shares(w map[string]uint32) map[string]float64 {
	sum := 0.0
	for _, v := range w {
		sum += float64(v)
	}
	out := map[string]float64{}
	for k, v := range w {
		out[k] = float64(v) / sum
	}
	return out
}

// TestK8sLeaderFailover: two control replicas under leader election (a Lease on the real
// API server); the leader is killed (SIGKILL) under load. No request fails, Envoy's
// shares move by at most 2 percentage points, and the new leader serves Envoy again
// within 5 s.
func TestK8sLeaderFailover(t *testing.T) {
	env := kubetest.Start(t)
	kubeconfig := kubetest.Kubeconfig(t, env.Config)
	electionArgs := []string{"--leader-elect", "--kubeconfig", kubeconfig, "--leader-elect-namespace", "default", "--leader-elect-lease", "meridian-control"}
	// MERIDIAN_FAILOVER_HOLD=0s measures what the takeover hold buys (docs/kubernetes.md);
	// the test's bounds hold for the default.
	if h := os.Getenv("MERIDIAN_FAILOVER_HOLD"); h != "" {
		electionArgs = append(electionArgs, "--takeover-hold", h)
	}
	s := startStack(t, stack.Spec{
		Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}},
		// Unequal engines, so that the optimizer's shares under load are not the
		// capacity-proportional ones a fresh leader would start from.
		Engines: []stack.EngineSpec{
			{Name: "e0", Region: "a", Models: []string{model}, CapacityRPS: 60, Args: []string{"--ttft", "20ms", "--itl", "2ms"}},
			{Name: "e1", Region: "a", Models: []string{model}, CapacityRPS: 30, Args: []string{"--ttft", "40ms", "--itl", "2ms"}},
			{Name: "e2", Region: "a", Models: []string{model}, CapacityRPS: 15, Args: []string{"--ttft", "60ms", "--itl", "4ms"}},
		},
		ControlArgs: electionArgs,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bins, _ := binaries()
	httpB, err := stack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(s.Nodes["region-a"].AccessLog)
	b := &stack.Proc{Name: "control-b", Bin: bins.Control, Log: filepath.Join(dir, "control-b.log"),
		Args: append(append([]string{"--fleet", s.FleetPath, "--xds-listen", s.ControlXDS, "--http-listen", "127.0.0.1:" + strconv.Itoa(httpB), "--poll-interval", "100ms"},
			controlTLSArgs(s)...), electionArgs...)}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Stop(5 * time.Second) })
	bURL := "http://127.0.0.1:" + strconv.Itoa(httpB)
	if err := stack.WaitHTTP(ctx, bURL+"/healthz", 200); err != nil {
		t.Fatalf("standby replica: %v (log %s)", err, b.Log)
	}

	// Load: 4 clients, bounded in count and time.
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	loadCtx, stopLoad := context.WithTimeout(ctx, 90*time.Second)
	defer stopLoad()
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; i < 5000 && loadCtx.Err() == nil; i++ {
				code, _, err := chat(loadCtx, s.Nodes["region-a"].URL, c*100000+i)
				if loadCtx.Err() != nil {
					return
				}
				sent.Add(1)
				if err != nil || code != 200 {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("status %d err %v", code, err))
				}
				time.Sleep(20 * time.Millisecond)
			}
		}(c)
	}
	// Let demand reports and weights settle under the leader.
	time.Sleep(8 * time.Second)
	before := shares(hosts(t, ctx, s))
	t.Logf("shares before the failover: %v", before)

	killed := time.Now()
	s.Control.Kill()
	leads, ok := kubetest.WaitFor(ctx, 30*time.Second, func() bool {
		m, err := stack.ScrapeMetrics(ctx, bURL+"/metrics")
		return err == nil && m.Value("meridian_control_leader") == 1
	})
	if !ok {
		t.Fatalf("the standby did not take the Lease (log %s)", b.Log)
	}
	t.Logf("leader killed -> the standby leads and has published: %s", leads.Round(time.Millisecond))
	// Envoy's stream to the dead leader is gone; it gets one to the new leader.
	_, ok = kubetest.WaitFor(ctx, 30*time.Second, func() bool { return envoyConnected(ctx, s.Nodes["region-a"].AdminURL) })
	if !ok {
		t.Fatalf("Envoy did not reconnect to the new leader (log %s)", b.Log)
	}
	serving := time.Since(killed)
	t.Logf("leader killed -> Envoy connected to the new leader: %s", serving.Round(time.Millisecond))
	// Shares over the next 10 s (inside the takeover hold) against those before.
	maxMove := 0.0
	for i := 0; i < 10; i++ {
		after := shares(hosts(t, ctx, s))
		for e, v := range before {
			maxMove = math.Max(maxMove, math.Abs(after[e]-v))
		}
		time.Sleep(time.Second)
	}
	stopLoad()
	wg.Wait()
	t.Logf("failover under load: %d requests, %d failed; largest share move %.2f pp; new leader published after %s, Envoy on it after %s",
		sent.Load(), failed.Load(), 100*maxMove, leads.Round(time.Millisecond), serving.Round(time.Millisecond))
	if failed.Load() > 0 {
		t.Errorf("%d of %d requests failed across the failover (first: %v)", failed.Load(), sent.Load(), firstErr.Load())
	}
	if maxMove > 0.02 {
		t.Errorf("an engine's share moved by %.2f pp across the failover, want <= 2", 100*maxMove)
	}
	if sent.Load() < 100 {
		t.Errorf("only %d requests were sent: the load did not run", sent.Load())
	}
	logB, _ := os.ReadFile(b.Log)
	if !strings.Contains(string(logB), "took over as leader") || !strings.Contains(string(logB), "held_weights=true") {
		t.Errorf("the standby did not take over with the leader's weights; its log:\n%s", logB)
	}
}

// controlTLSArgs are the TLS flags the stack gave its control server, for a second replica
// that must serve the same Envoys (none for a plaintext stack).
func controlTLSArgs(s *stack.Stack) []string {
	if s.PKI == nil {
		return nil
	}
	f := s.PKI.Files(mtls.Control())
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA, "--tls-reload", "250ms"}
}
