package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/meridian-router/meridian/control/dashboard"
	"github.com/meridian-router/meridian/control/server"
	"github.com/meridian-router/meridian/envoy/stack"
)

// TestDashboardShowsPublishedWeights runs a real control server and a real headless
// Chromium: the page must show exactly the weights /debug/state publishes, and follow
// them when the fleet file's weights change.
func TestDashboardShowsPublishedWeights(t *testing.T) {
	tab := browser(t, 50*time.Second)
	dir := t.TempDir()
	fleetPath := filepath.Join(dir, "fleet.yaml")
	writeFleet(t, fleetPath, map[string]map[string]int{
		"region-a": {"a-0": 600, "a-1": 300, "b-0": 100},
		"region-b": {"a-0": 50, "b-0": 500, "b-1": 450},
	})
	base := startControl(t, fleetPath)

	if err := chromedp.Do(tab, chromedp.Navigate(base+"/dashboard/"),
		chromedp.WaitVisible(chromedp.CSS(`td.cell[data-node="region-b"][data-engine="b-1"]`))); err != nil {
		t.Fatalf("load dashboard: %v", err)
	}
	want := publishedWeights(t, base)
	waitPage(t, tab, want)
	// region-a's fleet entry names its sidecar's decisions: every engine links there.
	href, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector('tr[data-engine="b-1"] td.decisions a[data-node="region-a"]').href`))
	if err != nil || href != "http://127.0.0.1:19081/debug/decisions?engine=b-1" {
		t.Fatalf("b-1's decisions link: %q (%v)", href, err)
	}

	writeFleet(t, fleetPath, map[string]map[string]int{
		"region-a": {"a-0": 100, "a-1": 100, "b-0": 800, "b-1": 5},
		"region-b": {"b-0": 1, "b-1": 999},
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		changed := publishedWeights(t, base)
		if !reflect.DeepEqual(changed, want) {
			want = changed
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the control server did not publish the new weights within 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if want["region-a"]["b-0"] != 800 || want["region-b"]["b-1"] != 999 {
		t.Fatalf("published weights %v are not the fleet file's", want)
	}
	waitPage(t, tab, want)
	png := screenshot(t, tab, dir, "dashboard.png")
	// `make figures-dashboard` sets MERIDIAN_DASHBOARD_PNG=docs/dashboard.png: this screenshot
	// is the README's figure of the dashboard.
	if out := os.Getenv("MERIDIAN_DASHBOARD_PNG"); out != "" {
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatalf("MERIDIAN_DASHBOARD_PNG: %v", err)
		}
		t.Logf("dashboard figure: %s", out)
	}
}

// waitPage waits up to 5 s (the page polls every second) for it to show want.
func waitPage(t *testing.T, tab context.Context, want map[string]map[string]uint32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := pageWeights(tab)
		if err != nil {
			t.Fatalf("read the page: %v", err)
		}
		if reflect.DeepEqual(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("page shows weights %v, the control server published %v", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDashboardToleratesFields serves hand-written /debug/state documents, one with every
// field the control server may add and one with only the required ones, and checks what
// the page draws from each.
func TestDashboardToleratesFields(t *testing.T) {
	tab := browser(t, 40*time.Second)
	full := `{"version":"v7","updated_at":"2026-01-02T03:04:05Z","models":["m"],"default_model":"m",
	  "nodes":{"region-a":{"region":"a","decisions_url":"http://127.0.0.1:19081/debug/decisions","models":{"m":{"weights":{"a-0":700,"b-0":300},"demand_rps":42.5,"shed_fraction":0.125,
	    "retry_budget":{"max_retries":1,"utilization":0.8}}}}},
	  "engines":[{"name":"a-0","region":"a","capacity_rps":20,"load_rps":18,"ttft_p50_ms":35.5,"penalty":0.25,"suspect":true},
	             {"name":"b-0","region":"b","capacity_rps":20,"load_rps":8,"ttft_p50_ms":80,"penalty":1,"draining":true}],
	  "solver":{"solve_ms":3.25,"objective":12.5,"solved_at":"2026-01-02T03:04:05Z"}}`
	minimal := `{"version":"v1","models":["m"],"nodes":{"region-a":{"models":{"m":{"weights":{"a-0":1}}}}},"engines":[{"name":"a-0"}]}`
	tests := []struct {
		name, state string
		// want maps a CSS selector to the text it must contain.
		want map[string]string
	}{
		{name: "every field", state: full, want: map[string]string{
			`tr[data-node="region-a"] td:nth-child(3)`: "42.5",
			`td[data-shed]`: "12.5%",
			`tr[data-node="region-a"] td:nth-child(5)`: "max_retries 1",
			`tr[data-engine="a-0"] td[data-penalty]`:   "0.25",
			`tr[data-engine="a-0"] td:last-child`:      "suspect",
			`tr[data-engine="b-0"] td:last-child`:      "draining",
			`tr[data-engine="a-0"] td:nth-child(5)`:    "90%",
			`#solver`:                                  "3.3 ms",
			`td.cell[data-engine="a-0"] .share`:        "70%",
			`tr[data-engine="b-0"] td.decisions`:       "region-a",
		}},
		{name: "required fields only", state: minimal, want: map[string]string{
			`tr[data-node="region-a"] td:nth-child(3)`: "–",
			`td[data-shed]`:                          "–",
			`tr[data-engine="a-0"] td[data-penalty]`: "–",
			`tr[data-engine="a-0"] td:last-child`:    "ok",
			`#solver`:                                "not reported",
			`td.cell[data-engine="a-0"] .share`:      "100%",
			`tr[data-engine="a-0"] td.decisions`:     "–",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := serveState(t, tc.state)
			if err := chromedp.Do(tab, chromedp.Navigate(base+"/dashboard/"),
				chromedp.WaitVisible(chromedp.CSS(`tr[data-engine="a-0"]`))); err != nil {
				t.Fatalf("load dashboard: %v", err)
			}
			for sel, want := range tc.want {
				text, err := chromedp.Run(tab, chromedp.Text(chromedp.CSS(sel)))
				if err != nil {
					t.Fatalf("%s: %v", sel, err)
				}
				if !strings.Contains(text, want) {
					t.Errorf("%s shows %q, want it to contain %q", sel, text, want)
				}
			}
			if status, err := chromedp.Run(tab, chromedp.Text(chromedp.CSS(`#status`))); err != nil || status != "live" {
				t.Errorf("status %q (%v), want live", status, err)
			}
		})
	}
}

// serveState serves the dashboard and a fixed /debug/state the way the control server does.
func serveState(t *testing.T, state string) string {
	t.Helper()
	if !json.Valid([]byte(state)) {
		t.Fatalf("test state is not JSON: %s", state)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /dashboard/", http.StripPrefix("/dashboard", dashboard.Handler()))
	mux.HandleFunc("GET /debug/state", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, state)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func writeFleet(t *testing.T, path string, weights map[string]map[string]int) {
	t.Helper()
	var b strings.Builder
	b.WriteString("models: [{name: m}]\nclusters:\n  - {name: region-a, region: a, decisions_url: \"http://127.0.0.1:19081/debug/decisions\"}\n  - {name: region-b, region: b}\nengines:\n")
	for i, name := range []string{"a-0", "a-1", "b-0", "b-1"} {
		fmt.Fprintf(&b, "  - {name: %s, address: \"127.0.0.1:%d\", region: %c, models: [m], capacity_rps: 20}\n", name, 9100+i, name[0])
	}
	b.WriteString("rtt_ms:\n  region-a: {a: 1, b: 40}\n  region-b: {a: 40, b: 1}\nweights:\n")
	for _, node := range []string{"region-a", "region-b"} {
		fmt.Fprintf(&b, "  %s: {", node)
		sep := ""
		for _, e := range []string{"a-0", "a-1", "b-0", "b-1"} {
			fmt.Fprintf(&b, "%s%s: %d", sep, e, weights[node][e])
			sep = ", "
		}
		b.WriteString("}\n")
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startControl builds and runs the meridian-control binary and returns its HTTP base URL.
func startControl(t *testing.T, fleetPath string) string {
	t.Helper()
	root, err := stack.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "meridian-control")
	build := exec.Command("go", "build", "-o", bin, "./control/cmd/meridian-control")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	xdsAddr, httpAddr := freeAddr(t), freeAddr(t)
	p := &stack.Proc{Name: "control", Bin: bin, Log: filepath.Join(dir, "control.log"),
		Args: []string{"--fleet", fleetPath, "--xds-listen", xdsAddr, "--http-listen", httpAddr, "--poll-interval", "50ms"}}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(2 * time.Second) })
	base := "http://" + httpAddr
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := stack.WaitHTTP(ctx, base+"/healthz", http.StatusOK); err != nil {
		log, _ := os.ReadFile(p.Log)
		t.Fatalf("control server not healthy: %v\n%s", err, log)
	}
	return base
}

// publishedWeights reads /debug/state's weights for the fleet's one model.
func publishedWeights(t *testing.T, base string) map[string]map[string]uint32 {
	t.Helper()
	resp, err := http.Get(base + "/debug/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st server.State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]uint32{}
	for node, ns := range st.Nodes {
		out[node] = map[string]uint32{}
		for e, w := range ns.Models["m"].Weights {
			out[node][e] = w
		}
	}
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
