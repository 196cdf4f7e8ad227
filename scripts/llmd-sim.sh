#!/usr/bin/env bash
# Builds llm-d-inference-sim, the llm-d project's vLLM simulator (written by others), from the
# Go module proxy into .tools/bin, for the e2e stack that runs meridian on an engine it did not
# write (envoy/e2e/llmd_test.go). Pure Go (CGO_ENABLED=0): no tokenizer library; the stack
# runs it with --force-dummy-tokenizer and POD_IP set, as its KV-cache code requires.
# Idempotent: a binary already built from the pinned version is kept.
#
#   scripts/llmd-sim.sh          build if missing; prints the binary's path last
set -euo pipefail
source "$(dirname "$0")/lib/gotool.sh"
go_tool llm-d-inference-sim github.com/llm-d/llm-d-inference-sim v0.10.2 ./cmd/llm-d-inference-sim
