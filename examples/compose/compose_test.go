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

	"gopkg.in/yaml.v3"

	"github.com/meridian-router/meridian/bootstrap"
	"github.com/meridian-router/meridian/control/fleet"
	"github.com/meridian-router/meridian/envoy/stack"
)

var update = flag.Bool("update", false, "rewrite the Envoy bootstraps from bootstrap.Render")

// demoFleet is the fleet file `make demo` loads (examples/demo/main.go's default).
const demoFleet = "../demo/fleet.yaml"

type composeFile struct {
	Networks map[string]struct {
		IPAM struct {
			Config []struct {
				Subnet string `yaml:"subnet"`
			} `yaml:"config"`
		} `yaml:"ipam"`
	} `yaml:"networks"`
	Services map[string]service `yaml:"services"`
}

type service struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
		Target     string `yaml:"target"`
	} `yaml:"build"`
	Command     []string  `yaml:"command"`
	Volumes     []string  `yaml:"volumes"`
	Networks    yaml.Node `yaml:"networks"`
	NetworkMode string    `yaml:"network_mode"`
	Profiles    []string  `yaml:"profiles"`
}

// ipv4 is the fixed address the service has on the meridian network, if any.
func (s service) ipv4() string {
	var nets map[string]struct {
		IPv4 string `yaml:"ipv4_address"`
	}
	if s.Networks.Kind != yaml.MappingNode || s.Networks.Decode(&nets) != nil {
		return ""
	}
	return nets["meridian"].IPv4
}

// arg returns the value after flag in the command.
func (s service) arg(flag string) string {
	i := slices.Index(s.Command, flag)
	if i < 0 || i+1 >= len(s.Command) {
		return ""
	}
	return s.Command[i+1]
}

// mount returns the host side of the volume mounted at target.
func (s service) mount(target string) string {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == target {
			return parts[0]
		}
	}
	return ""
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
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
	target := ctl.arg("--fleet")
	if target == "" || filepath.Clean(ctl.mount(target)) != filepath.Clean(demoFleet) {
		t.Errorf("control: --fleet %q is mounted from %q, want %s (the file `make demo` loads)", target, ctl.mount(target), demoFleet)
	}
	subnet := netip.MustParsePrefix(c.Networks["meridian"].IPAM.Config[0].Subnet)
	if ip := ctl.ipv4(); !subnet.Contains(netip.MustParseAddr(ip)) {
		t.Errorf("control address %q is outside %s", ip, subnet)
	}
	for _, e := range f.Engines {
		svc, ok := c.Services["engine-"+e.Name]
		if !ok {
			t.Errorf("engine %s of the fleet file has no engine-%s service", e.Name, e.Name)
			continue
		}
		addr := netip.MustParseAddrPort(e.Address)
		listen, err := netip.ParseAddrPort(svc.arg("--listen"))
		if svc.ipv4() != addr.Addr().String() || err != nil || listen.Port() != addr.Port() || svc.arg("--name") != e.Name {
			t.Errorf("engine-%s: ip %s, --listen %q, --name %q; the fleet file says %s and %s", e.Name, svc.ipv4(), svc.arg("--listen"), svc.arg("--name"), e.Address, e.Name)
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
	xds := c.Services["control"].ipv4() + ":" + portOf(c.Services["control"].arg("--xds-listen"))
	for _, cl := range f.Clusters {
		envoy, ok := c.Services["envoy-"+cl.Name]
		if !ok {
			t.Errorf("cluster %s has no envoy-%s service", cl.Name, cl.Name)
			continue
		}
		if !regexp.MustCompile(`^envoyproxy/envoy:v1\.40\.\d+$`).MatchString(envoy.Image) {
			t.Errorf("envoy-%s image %q: want the official envoyproxy/envoy:v1.40.x", cl.Name, envoy.Image)
		}
		path := envoy.mount(envoy.arg("-c"))
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
		case sc.arg("--node-id") != cl.Name || sc.NetworkMode != "service:envoy-"+cl.Name || sc.arg("--control") != xds:
			t.Errorf("sidecar-%s: --node-id %q, network_mode %q, --control %q", cl.Name, sc.arg("--node-id"), sc.NetworkMode, sc.arg("--control"))
		case sc.arg("--listen") != bootstrap.DefaultParams().Sidecar:
			t.Errorf("sidecar-%s listens on %q; the bootstrap calls %s", cl.Name, sc.arg("--listen"), bootstrap.DefaultParams().Sidecar)
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

// TestComposeBuildsFromTheDockerfile checks every built service names a stage of the
// multi-stage Dockerfile and the build stage is the Go toolchain.
func TestComposeBuildsFromTheDockerfile(t *testing.T) {
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^FROM\s+(\S+)\s+AS\s+(\S+)`).FindAllStringSubmatch(string(data), -1) {
		stages[m[2]] = m[1]
	}
	if !strings.HasPrefix(stages["build"], "golang:1.26") {
		t.Errorf("build stage is %q, want golang:1.26 (go.mod's Go)", stages["build"])
	}
	for name, s := range readCompose(t).Services {
		if s.Build == nil {
			continue
		}
		if _, ok := stages[s.Build.Target]; !ok || s.Build.Target == "build" {
			t.Errorf("%s builds target %q, not a final stage of the Dockerfile (%v)", name, s.Build.Target, stages)
		}
		if s.Build.Dockerfile != "examples/compose/Dockerfile" || filepath.Clean(s.Build.Context) != filepath.Clean("../..") {
			t.Errorf("%s builds %s in %s, want examples/compose/Dockerfile in the repository root", name, s.Build.Dockerfile, s.Build.Context)
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
