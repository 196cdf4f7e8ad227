package k8s

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/kube"
	"github.com/meridian-router/meridian/control/kube/kubetest"
	"github.com/meridian-router/meridian/envoy/stack"
)

// TestK8sModelsFromEngine: an InferencePool whose objects and source name no models. The
// control server asks each engine's /v1/models: the mock (model m) and llm-d-inference-sim
// (base m, LoRA adapters m-sql and one the fleet does not know) join with what they serve,
// and Envoy routes m-sql to the engine with that adapter. An engine that does not answer is
// logged once with the fix, counted and reported as an Event, and joins when it answers.
func TestK8sModelsFromEngine(t *testing.T) {
	env := kubetest.Start(t)
	kubeconfig := kubetest.Kubeconfig(t, env.Config)
	stack.RequireEnvoy(t)
	bins, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	bins.LLMDSim = stack.RequireLLMDSim(t)
	lora := func(name string) string {
		return fmt.Sprintf(`{"name":%q,"path":"/adapters/%s","base_model_name":%q}`, name, name, model)
	}
	s := stack.StartT(t, bins, stack.Spec{Nodes: []stack.NodeSpec{{Name: "region-a", Region: "a"}}, Engines: []stack.EngineSpec{
		{Name: "e0", Region: "a", Models: []string{model}, CapacityRPS: 50},
		{Name: "sim", Region: "a", Models: []string{model}, CapacityRPS: 50, LLMDSim: true,
			Args: []string{"--lora-modules", lora("m-sql"), lora("other-lora"), "--max-loras", "2"}},
		{Name: "e2", Region: "a", Models: []string{model}, CapacityRPS: 50},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// e2 is down when discovery starts: its /v1/models fails.
	s.Engines["e2"].Proc.Stop(5 * time.Second)

	ns := "llm"
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := func(e string) string { return s.Engines[e].Address }
	pools := dynamic.NewForConfigOrDie(env.Config).Resource(kube.PoolResource).Namespace(ns)
	if _, err := pools.Create(ctx, pool(ns, []int{port(addr("e0")), port(addr("sim")), port(addr("e2"))}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	readyPod(ctx, t, env.Client, ns)
	// No models in the source, none on the objects: they come from the engines.
	if err := s.EditFleet(func(f *fleet.Fleet) {
		f.Engines = nil
		f.Models = append(f.Models, fleet.Model{Name: "m-sql"})
		f.Discovery = &fleet.Discovery{Kubernetes: &fleet.KubernetesDiscovery{Kubeconfig: kubeconfig, Namespace: ns,
			InferencePools: []fleet.PoolSource{{EngineDefaults: fleet.EngineDefaults{Region: "a", CapacityRPS: 50}}}}}
	}); err != nil {
		t.Fatal(err)
	}
	edsOf := func(m string) string {
		ws, err := s.EnvoyWeights(ctx, "region-a")
		if err != nil {
			return ""
		}
		var out []string
		for a := range ws["model-"+m] {
			out = append(out, s.EngineByAddress(a))
		}
		sort.Strings(out)
		return strings.Join(out, ",")
	}
	if _, ok := kubetest.WaitFor(ctx, 60*time.Second, func() bool { return edsOf(model) == "e0,sim" && edsOf("m-sql") == "sim" }); !ok {
		t.Fatalf("Envoy's EDS: %s: %q, m-sql: %q; want e0,sim and sim (control log %s)", model, edsOf(model), edsOf("m-sql"), s.Control.Log)
	}
	// Requests for the adapter reach the engine that serves it, through Envoy (once the
	// sidecar's snapshot has it too).
	mSQL := func(i int) (int, string) {
		body := fmt.Sprintf(`{"model":"m-sql","messages":[{"role":"user","content":"q %d"}],"max_tokens":4}`, i)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.Nodes["region-a"].URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var code int
	var body string
	if took, ok := kubetest.WaitFor(ctx, 30*time.Second, func() bool { code, body = mSQL(0); return code == 200 }); !ok {
		t.Fatalf("m-sql through Envoy: %d %s", code, body)
	} else {
		t.Logf("m-sql routable %s after Envoy's EDS had it", took.Round(time.Millisecond))
	}
	for i := 1; i < 5; i++ {
		if code, body := mSQL(i); code != 200 {
			t.Fatalf("m-sql request %d: %d %s", i, code, body)
		}
	}

	// The first discovered fleet waited for the engines' answers: it was not refused for
	// having no engine.
	if b, _ := os.ReadFile(s.Control.Log); strings.Contains(string(b), "fleet file rejected") {
		t.Errorf("a discovered fleet was refused while the engines were being asked:\n%s", b)
	}

	// e2 does not answer: one log line with the fix, counted, and an Event on the pool.
	e2 := "GET http://" + addr("e2") + "/v1/models"
	var logText string
	if _, ok := kubetest.WaitFor(ctx, 30*time.Second, func() bool {
		b, _ := os.ReadFile(s.Control.Log)
		logText = string(b)
		return strings.Contains(logText, "cannot learn an engine's models") && strings.Contains(logText, addr("e2"))
	}); !ok {
		t.Fatalf("no log line for e2's failing /v1/models:\n%s", logText)
	}
	if !strings.Contains(logText, kube.AnnotationModels) {
		t.Errorf("the log line does not say how to fix it (%s):\n%s", kube.AnnotationModels, logText)
	}
	if n := strings.Count(logText, "cannot learn an engine's models"); n != 1 {
		t.Errorf("the failure was logged %d times, want once", n)
	}
	m, err := stack.ScrapeMetrics(ctx, s.ControlHTTP+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Value("meridian_control_discovery_model_requests_total", "result", "error"); got < 3 {
		t.Errorf("failed /v1/models requests counted: %v, want >= 3", got)
	}
	var events []string
	if _, ok := kubetest.WaitFor(ctx, 30*time.Second, func() bool {
		evs, err := env.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=llama"})
		if err != nil {
			return false
		}
		events = events[:0]
		for _, e := range evs.Items {
			events = append(events, e.Message)
			if e.Reason == "EngineRejected" && strings.Contains(e.Message, e2+" failed 3 times") {
				return true
			}
		}
		return false
	}); !ok {
		t.Fatalf("no EngineRejected Event on the pool naming %s: %q", e2, events)
	}

	// e2 comes up: it joins, on a retry, without any change to the cluster.
	if err := s.Engines["e2"].Proc.Start(); err != nil {
		t.Fatal(err)
	}
	took, ok := kubetest.WaitFor(ctx, 60*time.Second, func() bool { return edsOf(model) == "e0,e2,sim" })
	if !ok {
		t.Fatalf("e2 answers but did not join: EDS %q", edsOf(model))
	}
	t.Logf("e2 up -> in Envoy's EDS after %s (retry backoff at most 5s)", took.Round(time.Millisecond))
}
