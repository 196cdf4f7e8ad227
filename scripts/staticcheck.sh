#!/usr/bin/env bash
# Runs the pinned staticcheck (built into .tools/bin by scripts/setup.sh) on every package,
# tests included, and fails on any finding not in the temporary allowlist below.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
sc="$root/.tools/bin/staticcheck"
[ -x "$sc" ] || { echo "staticcheck: $sc missing: run scripts/setup.sh" >&2; exit 1; }

# TEMPORARY (issue 15): findings in files the lead is rewriting (extproc/server), left for that
# change to fix. Each entry matches one finding by file, message and check, not by line, so an
# edit elsewhere in the file does not hide a new finding. Delete the entry with the fix.
allow=(
  'extproc/server/metrics\.go:[0-9]+:[0-9]+: github\.com/prometheus/client_golang/prometheus\.NewGoCollector is deprecated: Use collectors\.NewGoCollector instead\.  \(SA1019\)$'
  'extproc/server/metrics\.go:[0-9]+:[0-9]+: github\.com/prometheus/client_golang/prometheus\.NewProcessCollector is deprecated: Use collectors\.NewProcessCollector instead\.  \(SA1019\)$'
)

cd "$root"
out=$("$sc" -f text ./... 2>&1) && rc=0 || rc=$?
if [ "$rc" -ne 0 ] && [ -z "$out" ]; then
  echo "staticcheck failed with status $rc and no output" >&2; exit "$rc"
fi
left=$out
for re in "${allow[@]}"; do
  left=$(grep -v -E "$re" <<<"$left" || true)
done
allowed=$(( $(grep -c . <<<"$out" || true) - $(grep -c . <<<"$left" || true) ))
if [ -n "$left" ]; then
  printf '%s\n' "$left"
  echo "staticcheck: $(grep -c . <<<"$left") finding(s) ($allowed more on the temporary allowlist in scripts/staticcheck.sh)" >&2
  exit 1
fi
echo "staticcheck: clean ($allowed finding(s) on the temporary allowlist in scripts/staticcheck.sh)"
