package layering

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// rule forbids packages under one top-level directory of the module from
// depending on packages under others.
type rule struct {
	from      string   // a top-level directory, e.g. "control"
	forbidden []string // top-level directories its packages must not reach
}

var rules = []rule{
	{from: "control", forbidden: []string{"extproc", "envoy"}},
	{from: "extproc", forbidden: []string{"control", "envoy"}},
}

// under reports whether the module-relative path rel is dir or inside it.
func under(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }

// violations walks graph (module-relative package path -> its direct imports,
// module-relative, packages outside the module left out) and returns, for each
// package a rule covers, the first import chain that reaches a forbidden
// directory, as "a -> b -> c". Sorted, so failures read the same every run.
func violations(graph map[string][]string, rules []rule) []string {
	var out []string
	for pkg := range graph {
		for _, r := range rules {
			if !under(pkg, r.from) {
				continue
			}
			if chain := forbiddenChain(graph, pkg, r.forbidden); chain != nil {
				out = append(out, strings.Join(chain, " -> "))
			}
		}
	}
	slices.Sort(out)
	return out
}

// forbiddenChain does a breadth-first search from start and returns the
// shortest import chain to a package under one of the forbidden directories.
func forbiddenChain(graph map[string][]string, start string, forbidden []string) []string {
	parent := map[string]string{start: ""}
	queue := []string{start}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, imp := range graph[p] {
			if _, seen := parent[imp]; seen {
				continue
			}
			parent[imp] = p
			if slices.ContainsFunc(forbidden, func(dir string) bool { return under(imp, dir) }) {
				chain := []string{imp}
				for q := p; q != ""; q = parent[q] {
					chain = append(chain, q)
				}
				slices.Reverse(chain)
				return chain
			}
			queue = append(queue, imp)
		}
	}
	return nil
}

// goList runs the go command in the module and returns its standard output.
func goList(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// TestLayering reads the import graph of every non-test package under
// control/ and extproc/ (and everything they reach) from `go list -deps` and
// fails on any path from a package to a directory its rule forbids.
func TestLayering(t *testing.T) {
	module := strings.TrimSpace(string(goList(t, "-m")))
	var patterns []string
	for _, r := range rules {
		patterns = append(patterns, module+"/"+r.from+"/...")
	}
	out := goList(t, append([]string{"-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}"}, patterns...)...)

	rel := func(path string) (string, bool) {
		r, ok := strings.CutPrefix(path, module+"/")
		return r, ok
	}
	graph := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		pkg, ok := rel(fields[0])
		if !ok {
			continue
		}
		graph[pkg] = nil
		for _, imp := range fields[1:] {
			if r, ok := rel(imp); ok {
				graph[pkg] = append(graph[pkg], r)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	// The check must not pass because go list returned nothing.
	for _, must := range []string{"control/server", "control/cmd/meridian-control", "extproc/server", "extproc/cmd/meridian-sidecar"} {
		if _, ok := graph[must]; !ok {
			t.Fatalf("go list -deps did not list %s; the layering check would prove nothing", must)
		}
	}
	for _, v := range violations(graph, rules) {
		t.Errorf("layering: %s (control/ must not import extproc/ or envoy/; extproc/ must not import control/ or envoy/)", v)
	}
}

// TestViolationsFindsIndirectChains proves the checker itself: a direct and a
// two-step forbidden import are both found, with their chains, and allowed
// imports are not reported.
func TestViolationsFindsIndirectChains(t *testing.T) {
	graph := map[string][]string{
		"control/a":     {"xdsapi"},
		"control/b":     {"control/a", "control/c"},
		"control/c":     {"proto/v1", "extproc/guard"},
		"extproc/x":     {"xdsapi", "extproc/y"},
		"extproc/y":     {"internal/z"},
		"internal/z":    {"envoy/stack"},
		"xdsapi":        {"proto/v1"},
		"envoy/stack":   {"control/a", "extproc/x"},
		"extproc/ok":    {"xdsapi"},
		"proto/v1":      nil,
		"extproc/guard": nil,
	}
	got := violations(graph, rules)
	want := []string{
		"control/b -> control/c -> extproc/guard",
		"control/c -> extproc/guard",
		"extproc/x -> extproc/y -> internal/z -> envoy/stack",
		"extproc/y -> internal/z -> envoy/stack",
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if got := violations(map[string][]string{"control/a": {"xdsapi"}, "xdsapi": nil}, rules); len(got) != 0 {
		t.Errorf("allowed import reported: %v", got)
	}
}
