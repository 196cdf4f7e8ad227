#!/usr/bin/env bash
# Builds Prometheus's promtool from the Go module proxy into .tools/bin, so that the tests
# check deploy/prometheus/meridian-rules.yaml with Prometheus's own rule loader
# (envoy/e2e/observability_test.go). Idempotent: a promtool built from the pinned version is kept.
set -euo pipefail
source "$(dirname "$0")/lib/gotool.sh"
go_tool promtool github.com/prometheus/prometheus v0.316.0 ./cmd/promtool # Prometheus 3.16
