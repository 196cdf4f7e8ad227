package compose

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/moby/buildkit/frontend/dockerfile/parser"

	"github.com/meridian-router/meridian/bootstrap"
	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/envoy/stack"
)

var update = flag.Bool("update", false, "rewrite the Envoy bootstraps from bootstrap.Render")

// demoFleet is the fleet file `make demo` loads (examples/demo/main.go's default).
const demoFleet = "../demo/fleet.yaml"

// readCompose loads docker-compose.yml with the Compose specification's own loader (the
// library `docker compose` uses): the file is validated against the compose schema, the
// x-meridian-build anchor merged, relative paths resolved against this directory, and every
// profile's services enabled.
func readCompose(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{"docker-compose.yml"}, cli.WithWorkingDirectory("."),
		cli.WithName("meridian"), cli.WithProfiles([]string{"*"}))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	if len(p.DisabledServices) != 0 {
		t.Fatalf("services left out of the project: %v", p.DisabledServices)
	}
	return p
}

// ipv4 is the fixed address the service has on the meridian network, if any.
func ipv4(s types.ServiceConfig) string {
	if n := s.Networks["meridian"]; n != nil {
		return n.Ipv4Address
	}
	return ""
}

// arg returns the value after flag in the command.
func arg(s types.ServiceConfig, flag string) string {
	i := slices.Index(s.Command, flag)
	if i < 0 || i+1 >= len(s.Command) {
		return ""
	}
	return s.Command[i+1]
}

// mount returns the host side (an absolute path, as the loader resolves it) of the volume
// mounted at target.
func mount(s types.ServiceConfig, target string) string {
	for _, v := range s.Volumes {
		if v.Target == target {
			return v.Source
		}
	}
	return ""
}

// abs is path relative to this directory, absolute.
func abs(t *testing.T, path string) string {
	t.Helper()
	a, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestComposeUsesTheDemoFleet checks the control server mounts the local demo's fleet file,
// and every engine of that file runs at its address.
func TestComposeUsesTheDemoFleet(t *testing.T) {
	c := readCompose(t)
	f, err := fleet.Load(demoFleet)
	if err != nil {
		t.Fatal(err)
	}
	ctl, ok := c.Services["control"]
	if !ok {
		t.Fatal("no control service")
	}
	target := arg(ctl, "--fleet")
	if target == "" || mount(ctl, target) != abs(t, demoFleet) {
		t.Errorf("control: --fleet %q is mounted from %q, want %s (the file `make demo` loads)", target, mount(ctl, target), abs(t, demoFleet))
	}
	subnet := netip.MustParsePrefix(c.Networks["meridian"].Ipam.Config[0].Subnet)
	if ip := ipv4(ctl); !subnet.Contains(netip.MustParseAddr(ip)) {
		t.Errorf("control address %q is outside %s", ip, subnet)
	}
	for _, e := range f.Engines {
		svc, ok := c.Services["engine-"+e.Name]
		if !ok {
			t.Errorf("engine %s of the fleet file has no engine-%s service", e.Name, e.Name)
			continue
		}
		addr := netip.MustParseAddrPort(e.Address)
		listen, err := netip.ParseAddrPort(arg(svc, "--listen"))
		if ipv4(svc) != addr.Addr().String() || err != nil || listen.Port() != addr.Port() || arg(svc, "--name") != e.Name {
			t.Errorf("engine-%s: ip %s, --listen %q, --name %q; the fleet file says %s and %s", e.Name, ipv4(svc), arg(svc, "--listen"), arg(svc, "--name"), e.Address, e.Name)
		}
		if svc.Build == nil || svc.Build.Target != "mockvllm" {
			t.Errorf("engine-%s is not built from the Dockerfile's mockvllm stage", e.Name)
		}
	}
}

// TestComposeBootstrapsAreRendered checks each data-plane cluster has an Envoy from the
// official v1.40 image whose mounted bootstrap is exactly what bootstrap.Render makes for it,
// and a sidecar with the same node id in the Envoy's network namespace.
func TestComposeBootstrapsAreRendered(t *testing.T) {
	c := readCompose(t)
	f, err := fleet.Load(demoFleet)
	if err != nil {
		t.Fatal(err)
	}
	xds := ipv4(c.Services["control"]) + ":" + portOf(arg(c.Services["control"], "--xds-listen"))
	for _, cl := range f.Clusters {
		envoy, ok := c.Services["envoy-"+cl.Name]
		if !ok {
			t.Errorf("cluster %s has no envoy-%s service", cl.Name, cl.Name)
			continue
		}
		if !regexp.MustCompile(`^envoyproxy/envoy:v1\.40\.\d+$`).MatchString(envoy.Image) {
			t.Errorf("envoy-%s image %q: want the official envoyproxy/envoy:v1.40.x", cl.Name, envoy.Image)
		}
		path := mount(envoy, arg(envoy, "-c"))
		if path != abs(t, "envoy-"+cl.Name+".yaml") {
			t.Errorf("envoy-%s mounts %q as its bootstrap, want envoy-%s.yaml here", cl.Name, path, cl.Name)
		}
		want := render(t, cl.Name, xds)
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("envoy-%s mounts %q: %v", cl.Name, path, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from bootstrap.Render for %s: run go test ./examples/compose -update", path, cl.Name)
		}
		sc, ok := c.Services["sidecar-"+cl.Name]
		switch {
		case !ok:
			t.Errorf("cluster %s has no sidecar-%s service", cl.Name, cl.Name)
		case arg(sc, "--node-id") != cl.Name || sc.NetworkMode != "service:envoy-"+cl.Name || arg(sc, "--control") != xds:
			t.Errorf("sidecar-%s: --node-id %q, network_mode %q, --control %q", cl.Name, arg(sc, "--node-id"), sc.NetworkMode, arg(sc, "--control"))
		case arg(sc, "--listen") != bootstrap.DefaultParams().Sidecar:
			t.Errorf("sidecar-%s listens on %q; the bootstrap calls %s", cl.Name, arg(sc, "--listen"), bootstrap.DefaultParams().Sidecar)
		}
	}
}

// render is the bootstrap for node in the compose network: listener on all interfaces,
// admin on loopback, the sidecar beside Envoy, and the demo's trusted priority header.
func render(t *testing.T, node, xds string) []byte {
	t.Helper()
	p := bootstrap.DefaultParams()
	p.NodeID, p.Listen, p.XDS, p.TrustPriorityHeader = node, "0.0.0.0:10000", xds, true
	p.Insecure = true // plaintext on the compose network, as the compose file says
	var b bytes.Buffer
	if err := bootstrap.Render(&b, p); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func portOf(hostport string) string {
	_, port, _ := strings.Cut(hostport, ":")
	return port
}

// dockerfileStages parses the Dockerfile with BuildKit's parser (what `docker build` runs)
// and returns each named stage's base image.
func dockerfileStages(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	for _, w := range res.Warnings {
		t.Errorf("Dockerfile line %d: %s", w.Location.Start.Line, w.Short)
	}
	stages := map[string]string{}
	for _, n := range res.AST.Children {
		if !strings.EqualFold(n.Value, "from") {
			continue
		}
		var args []string
		for a := n.Next; a != nil; a = a.Next {
			args = append(args, a.Value)
		}
		if len(args) != 3 || !strings.EqualFold(args[1], "as") {
			t.Errorf("Dockerfile line %d: FROM %v, want FROM image AS name", n.StartLine, args)
			continue
		}
		stages[args[2]] = args[0]
	}
	return stages
}

// TestComposeBuildsFromTheDockerfile checks every built service names a stage of the
// multi-stage Dockerfile and the build stage is the Go toolchain.
func TestComposeBuildsFromTheDockerfile(t *testing.T) {
	stages := dockerfileStages(t)
	if !strings.HasPrefix(stages["build"], "golang:1.26") {
		t.Errorf("build stage is %q, want golang:1.26 (go.mod's Go)", stages["build"])
	}
	root := abs(t, "../..")
	for name, s := range readCompose(t).Services {
		if s.Build == nil {
			continue
		}
		if _, ok := stages[s.Build.Target]; !ok || s.Build.Target == "build" {
			t.Errorf("%s builds target %q, not a final stage of the Dockerfile (%v)", name, s.Build.Target, stages)
		}
		if s.Build.Context != root || s.Build.Dockerfile != "examples/compose/Dockerfile" {
			t.Errorf("%s builds %s in %s, want examples/compose/Dockerfile in the repository root %s", name, s.Build.Dockerfile, s.Build.Context, root)
		}
	}
}

// TestComposeBootstrapsValidateInEnvoy runs the mounted bootstraps through the real Envoy.
func TestComposeBootstrapsValidateInEnvoy(t *testing.T) {
	envoy := stack.RequireEnvoy(t)
	for _, node := range []string{"region-a", "region-b"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, envoy, "--mode", "validate", "-c", fmt.Sprintf("envoy-%s.yaml", node), "--log-level", "error").CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("envoy-%s.yaml: %v\n%s", node, err, out)
		}
	}
}
