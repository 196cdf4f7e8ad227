#!/usr/bin/env bash
# Builds llm-d-inference-sim, the llm-d project's vLLM simulator (written by others), from the
# Go module proxy into .tools/bin, for the e2e stack that runs meridian on an engine it did not
# write (envoy/e2e/llmd_test.go). Pure Go (CGO_ENABLED=0): no tokenizer library; the stack
# runs it with --force-dummy-tokenizer and POD_IP set, as its KV-cache code requires.
# Idempotent: a binary already built from the pinned version is kept.
#
#   scripts/llmd-sim.sh          build if missing; prints the binary's path last
set -euo pipefail

version=v0.10.2
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.tools/bin"
out="$bin/llm-d-inference-sim"
stamp="$out.version"
mkdir -p "$bin"

if [ -x "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
  printf 'llmd-sim: found llm-d-inference-sim %s at %s\n' "$version" "$out"
  exit 0
fi
command -v go >/dev/null || { echo "llmd-sim: ERROR: go is not on PATH" >&2; exit 1; }
printf 'llmd-sim: building llm-d-inference-sim %s from the Go module proxy (CGO_ENABLED=0)\n' "$version"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# `go install pkg@version` asks the proxy for the module's version list (for deprecation
# notices), which the proxy may refuse; the pinned version itself downloads. So: download it,
# then build it in its own module (its go.mod and go.sum decide its dependencies).
dir=$(cd "$tmp" && GOFLAGS= go mod download -json "github.com/llm-d/llm-d-inference-sim@$version" \
      | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$dir" ] || [ ! -d "$dir" ] || ! (cd "$dir" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 \
      go build -trimpath -o "$tmp/llm-d-inference-sim" ./cmd/llm-d-inference-sim); then
  echo "llmd-sim: ERROR: building llm-d-inference-sim $version failed: check access to the Go module proxy" >&2
  exit 1
fi
mv "$tmp/llm-d-inference-sim" "$out"
echo "$version" > "$stamp"
printf 'llmd-sim: installed llm-d-inference-sim %s at %s\n' "$version" "$out"
