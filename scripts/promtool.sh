#!/usr/bin/env bash
# Builds Prometheus's promtool from the Go module proxy into .tools/bin, so that the tests
# check deploy/prometheus/meridian-rules.yaml with Prometheus's own rule loader
# (envoy/e2e/observability_test.go). Idempotent: a promtool built from the pinned version is kept.
set -euo pipefail

version=v0.316.0 # Prometheus 3.16
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.tools/bin"
out="$bin/promtool"
stamp="$out.version"
mkdir -p "$bin"

if [ -x "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
  printf 'promtool: found promtool %s at %s\n' "$version" "$out"
  exit 0
fi
command -v go >/dev/null || { echo "promtool: ERROR: go is not on PATH" >&2; exit 1; }
printf 'promtool: building promtool %s from the Go module proxy\n' "$version"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Built in Prometheus's own module, so its go.mod and go.sum decide the dependencies.
dir=$(cd "$tmp" && GOFLAGS= go mod download -json "github.com/prometheus/prometheus@$version" \
      | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$dir" ] || [ ! -d "$dir" ] || ! (cd "$dir" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 \
      go build -trimpath -o "$tmp/promtool" ./cmd/promtool); then
  echo "promtool: ERROR: building promtool $version failed: check access to the Go module proxy" >&2
  exit 1
fi
mv "$tmp/promtool" "$out"
echo "$version" > "$stamp"
printf 'promtool: installed promtool %s at %s\n' "$version" "$out"
