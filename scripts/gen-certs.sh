#!/usr/bin/env bash
# Issues a throwaway CA and every certificate a meridian fleet needs (control server, and
# each node's sidecar and Envoy), for demos and local runs. Running it again re-issues the
# certificates under the same CA: a rotation, picked up without restarts.
#   scripts/gen-certs.sh DIR NODE[,NODE...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: scripts/gen-certs.sh DIR NODE[,NODE...]" >&2; exit 2; }
go run ./mtls/cmd/meridian-certs --dir "$1" --nodes "$2"
