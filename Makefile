# meridian: see README.md. `make demo` and `make test` are the two entry points.
SHELL := /bin/bash
GO ?= go
TOOLS := $(CURDIR)/.tools
export MERIDIAN_ENVOY ?= $(TOOLS)/bin/envoy
export PATH := $(TOOLS)/bin:$(PATH)

.PHONY: all setup build test vet fmt proto demo bench sim clean fuzz

# Each fuzz target runs this many inputs in `make test` (a count, not a time: a timed run can
# fail with "context deadline exceeded" as it ends); longer runs: make fuzz FUZZTIME=5m
FUZZTIME ?= 30000x
FUZZ_TARGETS := \
	./extproc/request:FuzzParse \
	./extproc/request:FuzzParseMatchesEncodingJSON \
	./control/fleet:FuzzParse \
	./sim/trace:FuzzReadMooncake \
	./sim/trace:FuzzReadAzure

all: build

setup:
	@bash scripts/setup.sh

build: setup
	$(GO) build ./...

vet:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

test: setup vet proto-check staticcheck
	$(GO) test -count=1 -timeout 30m $$($(GO) list ./... | grep -vxF -f <($(GO) list $(RACE_PKGS)))
	@$(MAKE) --no-print-directory test-race
	@$(MAKE) --no-print-directory fuzz

# Bounded fuzzing of the parsers that take untrusted input. No minimizing of new inputs: a
# short run that ends mid-minimization fails with "context deadline exceeded".
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 0s $$pkg; \
	done

# Regenerates the committed Go code for proto/ with Debian's protoc and the pinned plugins
# (protoc-gen-go v1.36.12, protoc-gen-go-grpc v1.6.2) that scripts/setup.sh installs.
proto: setup
	@bash scripts/protogen.sh

# --- Checks in `make test` beyond vet and the tests --------------------------------------------
# proto-check: the committed .pb.go files are what proto/*.proto generates (regenerated into
# a temporary folder and diffed). staticcheck: the pinned version, clean. test-race: the
# unit packages under the race detector; the real-Envoy suites (envoy/, examples/) run
# without it in `make test`.
.PHONY: proto-check staticcheck test-race
RACE_PKGS := ./control/... ./extproc/... ./sim/...

proto-check: setup
	@bash scripts/protogen.sh --check

staticcheck: setup
	@bash scripts/staticcheck.sh

test-race: setup
	$(GO) test -race -count=1 -timeout 30m $(RACE_PKGS)

# Runs the whole system on this machine. DURATION=60s bounds it.
demo:
	@DURATION=$(DURATION) bash scripts/demo.sh

# The simulator on the Mooncake trace at 0.8 load, every scenario and policy; writes
# docs/results/ (report.md, results.json, plots).
SIM_TRACE ?= traces/mooncake_synthetic_trace.jsonl
sim:
	$(GO) run ./sim/cmd/meridian-sim --trace $(SIM_TRACE) --load 0.8 --scenario all --out docs/results

# The sidecar's overhead through a real Envoy (last line JSON), and the Go benchmarks.
bench: setup
	bash scripts/bench-overhead.sh
	$(GO) test -run '^$$' -bench 'BenchmarkPick|BenchmarkProcess' -benchmem ./extproc/...
	$(GO) test -run '^$$' -bench 'BenchmarkSolve' -benchmem ./control/solver

clean:
	rm -rf bin out
