#!/usr/bin/env bash
# Replays a time-scaled subset of a trace through real Envoys, sidecars and mock vLLM
# engines in two regions, and compares meridian with Envoy's own LEAST_REQUEST and
# RING_HASH (on a prompt-prefix header) on the same engines, restarted cold for each.
# Bounded: the subset's replay (85 s at the defaults) per configuration, each
# request within --timeout. The last line of output is JSON.
#   scripts/bench-fleet.sh [--trace traces/mooncake_synthetic_trace.jsonl] [--requests 480]
#                          [--speed 4] [--load 0.8] [--repeats 1]   (see --help)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
exec go run ./scripts/benchfleet "$@"
