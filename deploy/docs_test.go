package deploy

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"

	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/control/kube"
	"github.com/meridian-router/meridian/control/kube/kubetest"
)

type block struct {
	info string
	line int
	body []byte
}

func fences(t *testing.T, path string) []block {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []block
	var cur *block
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &block{info: strings.TrimSpace(strings.TrimPrefix(line, "```")), line: n}
		case cur != nil && strings.HasPrefix(line, "```"):
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.body = append(cur.body, line+"\n"...)
		}
	}
	return out
}

// TestK8sDocSnippets loads every block of docs/kubernetes.md as what its fence says: chart
// values are linted and rendered by helm (and the fleet file they make is parsed), an
// InferencePool is created on a real API server, a fleet file is parsed; sh and text blocks
// are commands and sample output.
func TestK8sDocSnippets(t *testing.T) {
	h := helm(t)
	var env *kubetest.Env
	loaded := 0
	for _, b := range fences(t, "../docs/kubernetes.md") {
		where := "docs/kubernetes.md:" + itoa(b.line)
		switch b.info {
		case "sh", "text":
			continue
		case "yaml meridian.chart-values":
			values := valuesFile(t, string(b.body))
			run(t, h, "lint", "--strict", chart, "-f", values)
			out := run(t, h, "template", "r1", chart, "-n", "meridian", "--kube-version", "1.37.2", "-f", values)
			for _, o := range docs(t, out) {
				if o.GetKind() == "ConfigMap" && o.GetName() == "r1-meridian-fleet" {
					data, _, _ := unstructured.NestedString(o.Object, "data", "fleet.yaml")
					if _, err := fleet.Parse(where, []byte(data)); err != nil {
						t.Errorf("%s: the chart makes an invalid fleet file: %v", where, err)
					}
				}
			}
		case "yaml meridian.fleet":
			if _, err := fleet.Parse(where, b.body); err != nil {
				t.Errorf("%s: %v", where, err)
			}
		case "yaml inference.networking.k8s.io/v1.InferencePool":
			if env == nil {
				env = kubetest.Start(t)
			}
			createPool(t, env, where, b.body)
		default:
			t.Errorf("%s: a block of kind %q: nothing checks it", where, b.info)
			continue
		}
		loaded++
	}
	if loaded < 2 {
		t.Fatalf("loaded %d blocks from docs/kubernetes.md", loaded)
	}
}

func createPool(t *testing.T, env *kubetest.Env, where string, body []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var obj map[string]any
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(body), 4096).Decode(&obj); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	u := &unstructured.Unstructured{Object: obj}
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: u.GetNamespace()}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(env.Config)
	data, _ := u.MarshalJSON()
	if _, err := dyn.Resource(kube.PoolResource).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: "meridian-docs-test", Force: ptrTo(true)}); err != nil {
		t.Errorf("%s: the API server rejects the InferencePool: %v", where, err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
