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

test: setup vet
	$(GO) test -count=1 -timeout 30m ./...
	@$(MAKE) --no-print-directory fuzz

# Bounded fuzzing of the parsers that take untrusted input. No minimizing of new inputs: a
# short run that ends mid-minimization fails with "context deadline exceeded".
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 0s $$pkg; \
	done

# Regenerates the committed Go code for proto/. Needs Debian's protobuf-compiler.
proto:
	@command -v protoc >/dev/null || { echo "protoc missing: apt-get install protobuf-compiler"; exit 1; }
	GOBIN=$(TOOLS)/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(TOOLS)/bin $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	protoc -I proto --go_out=proto --go_opt=paths=source_relative \
	  --go-grpc_out=proto --go-grpc_opt=paths=source_relative proto/meridian/v1/*.proto

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
