#!/usr/bin/env bash
# Measures the latency the meridian sidecar adds through a real Envoy, against a plain Envoy
# and against an Envoy whose ext_proc server changes nothing, over the same mock engines, at
# fixed request rates in one run (bounded: about prompt sizes x rates x 3 configs x slices x
# slice seconds). The last line of output is JSON.
#   scripts/bench-overhead.sh [--rates 200,500] [--slice 5s] [--slices 3] [--prompt-bytes 0,220000]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
exec go run ./scripts/benchoverhead "$@"
