#!/usr/bin/env bash
# Sets up what meridian needs, then runs the whole system on this machine, plays the demo's
# story through it (examples/demo) and prints a report.
#   DURATION  how long traffic runs (default 60s); the run needs no input and exits 0
#   SCALE     multiplies every request rate (default 1; lower it on a slow machine)
# Ctrl-C stops every process the demo started and still prints the report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p bin
go build -o bin/meridian-demo ./examples/demo
exec bin/meridian-demo --duration "${DURATION:-60s}" --scale "${SCALE:-1}"
