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

// EnvoyPath finds the Envoy binary: $MERIDIAN_ENVOY, then the one scripts/setup.sh installs
// (.tools/bin/envoy), then envoy on PATH.
func EnvoyPath() (string, error) {
	if p := os.Getenv("MERIDIAN_ENVOY"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if root, err := RepoRoot(); err == nil {
		p := filepath.Join(root, ".tools", "bin", "envoy")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("envoy"); err == nil {
		return p, nil
	}
	return "", errors.New("no Envoy binary: run scripts/setup.sh (or `make setup`), or set MERIDIAN_ENVOY")
}

// RequireEnvoy returns the Envoy binary's path. Without one it skips the test on a
// developer's machine and fails it in CI (CI=true): integration tests never skip there.
func RequireEnvoy(t testing.TB) string {
	t.Helper()
	p, err := EnvoyPath()
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %v", err)
	}
	t.Skip(err)
	return ""
}

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
	if p := os.Getenv("MERIDIAN_LLMD_SIM"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if root, err := RepoRoot(); err == nil {
		p := filepath.Join(root, ".tools", "bin", "llm-d-inference-sim")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("llm-d-inference-sim"); err == nil {
		return p, nil
	}
	return "", errors.New("no llm-d-inference-sim binary: run scripts/llmd-sim.sh (or `make setup`), or set MERIDIAN_LLMD_SIM")
}

// RequireLLMDSim returns llm-d-inference-sim's path. Without it the test is skipped on a
// developer's machine and fails in CI (CI=true).
func RequireLLMDSim(t testing.TB) string {
	t.Helper()
	p, err := LLMDSimPath()
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %v", err)
	}
	t.Skip(err)
	return ""
}
