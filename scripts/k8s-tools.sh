#!/usr/bin/env bash
# Builds the Kubernetes tools meridian's Kubernetes tests and chart checks use, from the Go
# module proxy, into .tools/k8s/bin (pinned versions; a warm machine rebuilds nothing):
#
#   - kube-apiserver from k8s.io/kubernetes v1.37.2 (staging modules k8s.io/* v0.37.2)
#   - etcd from go.etcd.io/etcd/server/v3 v3.6.16
#   - helm from helm.sh/helm/v3 v3.22.0
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every k8s.io/* staging module
# with a directory of its own tree. The script writes a throwaway build module under
# .tools/k8s/src that requires it and replaces each staging module with its published v0.37.2.
# Each binary is stamped with a file naming the version it was built from; a binary whose stamp
# matches is kept. Tests find the binaries through KUBEBUILDER_ASSETS=.tools/k8s/bin.
#
# Cold (nothing in the Go module or build cache), measured on a 2-core machine shared with
# five other builds (load average about 20): kube-apiserver 1392 s, etcd 199 s, helm 556 s,
# 36 min in all; an unloaded 2-core machine builds kube-apiserver in about 4 min. Warm
# (binaries stamped with their version): 0.01 s, a check.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
k8s="$root/.tools/k8s"
bin="$k8s/bin"
src="$k8s/src"
mkdir -p "$bin" "$src"

KUBE_VERSION=v1.37.2
STAGING_VERSION=v0.37.2
ETCD_VERSION=v3.6.16
HELM_VERSION=v3.22.0

say() { printf 'k8s-tools: %s\n' "$*"; }
die() { printf 'k8s-tools: ERROR: %s\n' "$*" >&2; exit 1; }
command -v go >/dev/null || die "go is not on PATH"

# fresh NAME VERSION: true when bin/NAME exists and was built from VERSION.
fresh() { [ -x "$bin/$1" ] && [ "$(cat "$bin/.$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" >"$bin/.$1.version"; }
timed() { # NAME CMD...: runs CMD, says how long it took
  local name=$1 t0 t1; shift
  t0=$(date +%s)
  "$@"
  t1=$(date +%s)
  say "built $name in $((t1 - t0)) s"
}

# --- kube-apiserver ----------------------------------------------------------------------
build_apiserver() {
  local dir="$src/kube-apiserver" gomod
  mkdir -p "$dir"
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -f "$gomod" ] || die "could not download k8s.io/kubernetes@$KUBE_VERSION from the Go module proxy"
  {
    echo "module meridian.local/k8s-tools/kube-apiserver"
    echo
    echo "go $(go env GOVERSION | sed 's/^go//')"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    # every staging module that k8s.io/kubernetes replaces with a directory of its own tree
    sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$gomod" |
      while read -r m; do echo "	$m => $m $STAGING_VERSION"; done
    echo ")"
  } >"$dir/go.mod"
  # a main package is not importable, so the module has no Go file: build the package by path,
  # letting go resolve go.sum for it
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags=-s -o "$bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
}
if fresh kube-apiserver "$KUBE_VERSION"; then
  say "found kube-apiserver $KUBE_VERSION"
else
  say "building kube-apiserver $KUBE_VERSION from the Go module proxy (a few minutes on a cold machine)"
  timed kube-apiserver build_apiserver || die "building kube-apiserver failed"
  stamp kube-apiserver "$KUBE_VERSION"
fi

# --- etcd --------------------------------------------------------------------------------
build_etcd() {
  local dir="$src/etcd"
  mkdir -p "$dir"
  cat >"$dir/go.mod" <<EOF
module meridian.local/k8s-tools/etcd

go $(go env GOVERSION | sed 's/^go//')

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
  cat >"$dir/main.go" <<'EOF'
// Command etcd is etcd's server, for meridian's Kubernetes tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags=-s -o "$bin/etcd" .)
}
if fresh etcd "$ETCD_VERSION"; then
  say "found etcd $ETCD_VERSION"
else
  say "building etcd $ETCD_VERSION from the Go module proxy"
  timed etcd build_etcd || die "building etcd failed"
  stamp etcd "$ETCD_VERSION"
fi

# --- helm --------------------------------------------------------------------------------
if fresh helm "$HELM_VERSION"; then
  say "found helm $HELM_VERSION"
else
  say "building helm $HELM_VERSION from the Go module proxy"
  timed helm env CGO_ENABLED=0 GOBIN="$bin" go install -trimpath -ldflags=-s "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    || die "building helm failed"
  stamp helm "$HELM_VERSION"
fi

say "Kubernetes test assets: KUBEBUILDER_ASSETS=$bin"
