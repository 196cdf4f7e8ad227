#!/usr/bin/env bash
# Runs the pinned staticcheck (built into .tools/bin by scripts/setup.sh) on every package,
# tests included, and fails on any finding.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
sc="$root/.tools/bin/staticcheck"
[ -x "$sc" ] || { echo "staticcheck: $sc missing: run scripts/setup.sh" >&2; exit 1; }

cd "$root"
if ! out=$("$sc" -f text ./... 2>&1); then
  [ -n "$out" ] || { echo "staticcheck failed with no output" >&2; exit 1; }
  printf '%s\n' "$out"
  echo "staticcheck: $(grep -c . <<<"$out") finding(s)" >&2
  exit 1
fi
echo "staticcheck: clean"
