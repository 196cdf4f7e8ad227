package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meridian-router/meridian/envoy/stack"
)

// demoBin is the demo command and binDir the system's binaries, built once by TestMain so
// the tests run the demo as `make demo` does: a process with its own children, exit
// status and signals.
var demoBin, binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "demo-test-")
	if err != nil {
		panic(err)
	}
	demoBin, binDir = filepath.Join(dir, "demo"), dir
	// Without Envoy there is nothing to build for: each test's RequireEnvoy skips it, or
	// fails it in CI.
	if _, envoyErr := stack.EnvoyPath(); envoyErr == nil {
		err = buildAll(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildAll(dir string) error {
	root, err := stack.RepoRoot()
	if err != nil {
		return err
	}
	if _, err := stack.Build(dir); err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "demo"), "./examples/demo")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// TestDemoRunsTheStory runs the demo for 12 s and checks that it exits 0 with a report
// made of measurements: every phase saw answered requests with a TTFT, the surge raised
// the busy region's rate, the slowed engine was the slowest of its region (or answered
// nothing while slowed, having answered in steady), and Envoy's counters were read.
func TestDemoRunsTheStory(t *testing.T) {
	stack.RequireEnvoy(t)
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "report.json")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, demoBin, "--bins", binDir, "--duration", "12s", "--live", "off", "--dir", filepath.Join(dir, "run"), "--report-json", jsonPath)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"== meridian demo report", "what happened:", "surge: region-a offered", "overload:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var r report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("report JSON: %v", err)
	}
	root, _ := stack.RepoRoot()
	topo, err := loadTopology(filepath.Join(root, "examples", "demo", "fleet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	checkReport(t, &r, topo)
}

func checkReport(t *testing.T, r *report, topo *topology) {
	t.Helper()
	if r.Interrupted || len(r.Phases) != len(story) {
		t.Fatalf("report has %d phases (interrupted %v), want %d", len(r.Phases), r.Interrupted, len(story))
	}
	requests := 0.0
	for _, ph := range r.Phases {
		if ph.All.OK == 0 || ph.All.TTFTP50Ms <= 0 || ph.All.TTFTP99Ms < ph.All.TTFTP50Ms {
			t.Errorf("phase %s: %d ok, TTFT p50 %v p99 %v: want answered requests with measured TTFTs", ph.Name, ph.All.OK, ph.All.TTFTP50Ms, ph.All.TTFTP99Ms)
		}
		if len(ph.Weights["region-a"]) == 0 || len(ph.Weights["region-b"]) == 0 || ph.Snapshot == "" {
			t.Errorf("phase %s: weights %v snapshot %q: want the control server's published weights", ph.Name, ph.Weights, ph.Snapshot)
		}
		for _, rs := range ph.Retries {
			requests += rs.Requests
		}
	}
	if requests == 0 {
		t.Error("Envoy's upstream request counters read as zero")
	}
	steady, surge := r.Phases[0].Nodes["region-a"], r.Phases[1].Nodes["region-a"]
	if surge.OfferedRPS < 1.5*steady.OfferedRPS {
		t.Errorf("region-a offered %.1f req/s in the surge and %.1f in steady: the surge did not happen", surge.OfferedRPS, steady.OfferedRPS)
	}
	slow := r.Phases[2]
	var peers []float64
	for e, v := range slow.All.EngineTTFTP50Ms {
		if e != slow.SlowEngine && topo.region(e) == topo.region(slow.SlowEngine) {
			peers = append(peers, v)
		}
	}
	// In a 12 s run the slow phase lasts about 2 s, and the sidecars may route around the
	// slowed engine entirely (penalties, the least-work choice, overflow to the other
	// region): then it answered nothing in the phase that it answered in steady.
	avoided := slow.All.Engines[slow.SlowEngine] == 0 && r.Phases[0].All.Engines[slow.SlowEngine] > 0
	if slow.SlowEngine == "" || len(peers) == 0 || (!avoided && slow.All.EngineTTFTP50Ms[slow.SlowEngine] <= slices.Max(peers)) {
		t.Errorf("slow phase: engine %q TTFT p50 %v (%d answered; %d in steady), peers %v: want the slowed engine slowest, or avoided",
			slow.SlowEngine, slow.All.EngineTTFTP50Ms[slow.SlowEngine], slow.All.Engines[slow.SlowEngine], r.Phases[0].All.Engines[slow.SlowEngine], peers)
	}
	if len(r.Findings) < 4 {
		t.Errorf("findings %q: want one per act", r.Findings)
	}
}

// TestDemoInterruptStopsEverything sends SIGINT (Ctrl-C) while traffic runs: the demo
// must print its report, exit 130, and leave none of its servers listening.
func TestDemoInterruptStopsEverything(t *testing.T) {
	stack.RequireEnvoy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, demoBin, "--bins", binDir, "--duration", "60s", "--live", "off", "--dir", t.TempDir())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrRE := regexp.MustCompile(`http://(127\.0\.0\.1:\d+)`)
	var addrs []string
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		if strings.HasPrefix(line, "demo: dashboard") || strings.HasPrefix(line, "demo: region-") {
			for _, m := range addrRE.FindAllStringSubmatch(line, -1) {
				addrs = append(addrs, m[1])
			}
		}
		if strings.Contains(line, " | region-a ") { // the first progress line: traffic started
			break
		}
	}
	if len(addrs) < 5 {
		t.Fatalf("found servers %v in the output, want control + 2 Envoys (and admins):\n%s", addrs, out.String())
	}
	time.Sleep(2 * time.Second)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 {
		t.Fatalf("demo exited with %v, want status 130\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "interrupted") {
		t.Errorf("no interrupted report:\n%s", out.String())
	}
	for _, a := range addrs {
		if c, err := net.DialTimeout("tcp", a, 200*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the demo exited", a)
		}
	}
}
