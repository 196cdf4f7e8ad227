package stack

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RepoRoot finds the module root (the directory holding go.mod) above the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: run from inside the meridian repository")
		}
		dir = parent
	}
}

// toolPath finds a tool the tests run: $env, then the one the project's scripts install
// (.tools/bin/name), then name on PATH; install says how to get it.
func toolPath(env, name, install string) (string, error) {
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if root, err := RepoRoot(); err == nil {
		p := filepath.Join(root, ".tools", "bin", name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no %s binary: run %s (or `make setup`), or set %s", name, install, env)
}

// requireTool returns find's path. Without one it skips the test on a developer's machine
// and fails it in CI (CI=true): integration tests never skip there.
func requireTool(t testing.TB, find func() (string, error)) string {
	t.Helper()
	p, err := find()
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %v", err)
	}
	t.Skip(err)
	return ""
}

// EnvoyPath finds the Envoy binary: $MERIDIAN_ENVOY, then the one scripts/setup.sh installs
// (.tools/bin/envoy), then envoy on PATH.
func EnvoyPath() (string, error) {
	return toolPath("MERIDIAN_ENVOY", "envoy", "scripts/setup.sh")
}

// RequireEnvoy returns the Envoy binary's path (see requireTool).
func RequireEnvoy(t testing.TB) string { t.Helper(); return requireTool(t, EnvoyPath) }

// Binaries are the project's executables a stack runs.
type Binaries struct {
	Control, Sidecar, MockEngine, Envoy string
	// LLMDSim is llm-d-inference-sim, for engines with EngineSpec.LLMDSim (see LLMDSimPath).
	LLMDSim string
}

// Build compiles the binaries into dir (the Go build cache makes repeat builds cheap).
func Build(dir string) (Binaries, error) {
	envoy, err := EnvoyPath()
	if err != nil {
		return Binaries{}, err
	}
	root, err := RepoRoot()
	if err != nil {
		return Binaries{}, err
	}
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator),
		"./control/cmd/meridian-control", "./extproc/cmd/meridian-sidecar", "./examples/mockvllm")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("go build: %w\n%s", err, out)
	}
	return Binaries{
		Control:    filepath.Join(dir, "meridian-control"),
		Sidecar:    filepath.Join(dir, "meridian-sidecar"),
		MockEngine: filepath.Join(dir, "mockvllm"),
		Envoy:      envoy,
	}, nil
}

// LLMDSimPath finds llm-d-inference-sim: $MERIDIAN_LLMD_SIM, then the one
// scripts/llmd-sim.sh builds (.tools/bin/llm-d-inference-sim), then one on PATH.
func LLMDSimPath() (string, error) {
	return toolPath("MERIDIAN_LLMD_SIM", "llm-d-inference-sim", "scripts/llmd-sim.sh")
}

// RequireLLMDSim returns llm-d-inference-sim's path (see requireTool).
func RequireLLMDSim(t testing.TB) string { t.Helper(); return requireTool(t, LLMDSimPath) }
