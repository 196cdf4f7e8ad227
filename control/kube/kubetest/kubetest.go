// Package kubetest starts a real etcd and kube-apiserver for tests (controller-runtime's
// envtest), from the binaries scripts/k8s-tools.sh builds into .tools/k8s/bin, with the
// InferencePool CRD of the Gateway API Inference Extension module installed.
//
// A missing binary skips the test on a developer's machine and fails it under CI=true.
package kubetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// InferenceExtensionModule is the module whose CRD the API server gets (pinned in go.mod).
const InferenceExtensionModule = "sigs.k8s.io/gateway-api-inference-extension"

// Env is a running API server.
type Env struct {
	Env    *envtest.Environment
	Config *rest.Config // cluster-admin
	Client kubernetes.Interface
}

// AssetsDir finds the directory with etcd and kube-apiserver: $KUBEBUILDER_ASSETS, else the
// repository's .tools/k8s/bin.
func AssetsDir() (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			d := filepath.Join(dir, ".tools", "k8s", "bin")
			for _, b := range []string{"etcd", "kube-apiserver"} {
				if _, err := os.Stat(filepath.Join(d, b)); err != nil {
					return "", fmt.Errorf("no %s in %s: run scripts/k8s-tools.sh (or `make setup`), or set KUBEBUILDER_ASSETS", b, d)
				}
			}
			return d, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: set KUBEBUILDER_ASSETS")
		}
		dir = parent
	}
}

// Require returns the assets directory, or skips t (fails it under CI=true).
func Require(t testing.TB) string {
	t.Helper()
	d, err := AssetsDir()
	if err == nil {
		return d
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %v", err)
	}
	t.Skip(err)
	return ""
}

// CRDDir is the directory of the Inference Extension's CRDs in the module cache.
func CRDDir() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", InferenceExtensionModule).Output()
	if err != nil {
		return "", fmt.Errorf("locate %s: %w (is it in go.mod, and the module downloaded?)", InferenceExtensionModule, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("locate %s: not downloaded: run go mod download", InferenceExtensionModule)
	}
	return filepath.Join(dir, "config", "crd", "bases"), nil
}

// Start starts etcd and kube-apiserver on free 127.0.0.1 ports and stops them when t ends.
func Start(t testing.TB) *Env {
	t.Helper()
	assets := Require(t)
	crds, err := CRDDir()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{crds},
		ErrorIfCRDPathMissing: true,
		// On a loaded machine a graceful shutdown can take longer than envtest's 20 s.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	api := env.ControlPlane.GetAPIServer()
	// A host with only a loopback interface has no address to advertise otherwise, and no
	// kubernetes Service endpoints to reconcile.
	// A directory of our own keeps the serving certificate across a restart (envtest
	// deletes a directory it made when the server stops).
	api.CertDir = t.TempDir()
	api.Configure().Set("advertise-address", "127.0.0.1").Set("endpoint-reconciler-type", "none")
	if testing.Verbose() {
		api.Out, api.Err = os.Stderr, os.Stderr
	}
	ctrllog.SetLogger(logr.Discard())
	start := time.Now()
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start etcd and kube-apiserver from %s: %v", assets, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stop the API server: %v", err)
		}
	})
	t.Logf("kube-apiserver up at %s in %s", cfg.Host, time.Since(start).Round(time.Millisecond))
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Env: env, Config: cfg, Client: client}
}

// RestartAPIServer stops kube-apiserver (etcd keeps running), runs during, then starts it
// again on the same port.
func (e *Env) RestartAPIServer(t testing.TB, during func()) {
	t.Helper()
	api := e.Env.ControlPlane.GetAPIServer()
	// A graceful stop that times out ends with SIGKILL: the server is gone either way.
	if err := api.Stop(); err != nil && !strings.Contains(err.Error(), "timeout waiting for process") {
		t.Fatalf("stop kube-apiserver: %v", err)
	}
	during()
	if err := api.Start(); err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}
}

// User makes a user with no permissions (only what RBAC grants it later), and returns its
// connection.
func (e *Env) User(t testing.TB, name string) *rest.Config {
	t.Helper()
	u, err := e.Env.ControlPlane.AddUser(envtest.User{Name: name}, e.Config)
	if err != nil {
		t.Fatalf("add user %s: %v", name, err)
	}
	return u.Config()
}

// Kubeconfig writes a kubeconfig file for rc (a separate process, such as the control
// server, reaches the API server with it) and returns its path.
func Kubeconfig(t testing.TB, rc *rest.Config) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["envtest"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	cfg.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData, Token: rc.BearerToken}
	cfg.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	cfg.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// WaitFor polls cond every 10ms until it is true or timeout passes, and reports how long
// it took.
func WaitFor(ctx context.Context, timeout time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > timeout || ctx.Err() != nil {
			return time.Since(start), false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
