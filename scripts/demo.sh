#!/usr/bin/env bash
# Sets up what meridian needs, then runs the whole system on this machine and prints a report.
# DURATION (default 20s) bounds how long traffic runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec go run ./examples/demo --duration "${DURATION:-20s}"
