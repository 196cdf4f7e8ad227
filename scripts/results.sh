#!/usr/bin/env bash
# Regenerates every simulator report and table under docs/results/ with the command each one
# states in its first lines, in an order that lets the later runs read the earlier tables:
#
#   1. the scenarios (`make sim`'s command, H100 at 0.6 and A100 at 0.4 x cold);
#   2. the capacity tables at seed 1 (every trace, both GPUs);
#   3. the same over four seeds;
#   4. the oracles and the agentic A100 global run at 0.65 x cold;
#   5. KV hit at the best anchor's capacity: the load is llm-d-precise's per-region
#      capacity_load in step 2's Mooncake tables, to 3 digits (the tables' "x cold");
#   6. shedding and churn at 0.9x meridian's own capacity: the load is 0.9 x
#      meridian-defaults' per-region capacity_load in step 2's tables, to 4 digits.
#
# About 70 minutes on the 2-core machine: the capacity tables' pages state their wall times,
# 65 minutes together at the tables in the repository, most of it the four-seed agentic
# ones; the other runs take seconds each. Each command prints a progress line, and the
# first that fails stops the run. The prose in
# docs/results/README.md that quotes the tables is not rewritten: compare and edit it.
#
# usage: scripts/results.sh [--list] [--only REGEX]
#   --list        print the commands (steps 5 and 6 with the loads today's tables give) and exit
#   --only REGEX  run only the commands whose --out matches REGEX (grep -E)
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

list=false only=""
while [ $# -gt 0 ]; do
	case $1 in
	--list) list=true ;;
	--only) only=${2:?--only needs a REGEX}; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "results.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done

cd "$(dirname "$0")/.."
M=traces/mooncake_synthetic_trace.jsonl
A=traces/AzureLLMInferenceTrace_conv.csv
G=traces/aiperf_agentic_code_sessions.jsonl
R=docs/results
SIX=p-controller,llm-d,llm-d-precise,dynamo,sglang,meridian-defaults

# factor x a table's capacity_load (x cold) for one policy's per-region row, from its
# capacity.json, to digits places.
load_of() { # dir policy factor digits
	python3 - "$R/$1/capacity.json" "$2" "$3" "$4" <<'EOF'
import json, sys
path, policy, factor, digits = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
try:
    rows = json.load(open(path))
except OSError as e:
    sys.exit(f"results.sh: {e}: run the capacity tables (step 2) first")
for r in rows:
    if r["policy"] == policy and r["deployment"] == "region":
        print(round(factor * r["capacity_load"], digits))
        break
else:
    sys.exit(f"results.sh: {path} has no per-region row for {policy}")
EOF
}

# gpu_flag turns a table's GPU name into meridian-sim's --gpu value.
gpu_flag() {
	case $1 in
	h100) echo h100-80gb ;;
	a100) echo a100-40gb ;;
	esac
}

# Each command is one line: meridian-sim's arguments.
static_commands() {
	local seeds s p n gpu g
	echo "--trace $M --gpu h100-80gb --load 0.6 --scenario all --out $R"
	echo "--trace $M --gpu a100-40gb --load 0.4 --scenario all --out $R/scenarios-a100"
	for seeds in 1 4; do
		s="" p="" n=""
		if [ $seeds -gt 1 ]; then s="--seeds $seeds " p="--policies $SIX " n="seeds$seeds-"; fi
		for gpu in h100 a100; do
			g=$(gpu_flag $gpu)
			echo "--trace $M --capacity ${s}--gpu $g --deployment region,global --out $R/capacity-$n$gpu --quiet"
			echo "--trace $M --arrivals $A --capacity ${s}--gpu $g --deployment region,global --out $R/capacity-$n$gpu-mooncake-on-azure-arrivals --quiet"
			echo "--trace $A --capacity ${s}--gpu $g --deployment region,global --out $R/capacity-$n$gpu-azure --quiet"
			echo "--trace $G --capacity ${s}--gpu $g --deployment region,global ${p}--out $R/capacity-$n$gpu-agentic --quiet"
		done
	done
	for gpu in h100 a100; do
		g=$(gpu_flag $gpu)
		echo "--trace $M --capacity --gpu $g --replicas 1 --kv-event-delay 0 --policies oracle,llm-d-precise --out $R/oracle-$gpu --quiet"
		echo "--trace $M --capacity --gpu $g --deployment global --kv-event-delay 0 --policies oracle --out $R/oracle-$gpu-global --quiet"
	done
	echo "--trace $M --capacity --gpu h100-80gb --replicas 1 --kv-event-delay 0 --kv-tokens 50000000 --policies oracle,llm-d-precise,meridian-defaults --out $R/oracle-h100-unbounded-cache --quiet"
	echo "--trace $G --gpu a100-40gb --load 0.65 --deployment global --policies meridian-defaults,dynamo,llm-d-precise --out $R/agentic-a100-global-0.65 --quiet"
}

# The runs whose load a table of step 2 gives. Each load is read before its line is
# printed, so that a missing table stops the run (set -e) instead of running without it.
derived_commands() {
	local gpu g l
	for gpu in h100 a100; do
		g=$(gpu_flag $gpu)
		l=$(load_of capacity-$gpu llm-d-precise 1 3)
		echo "--trace $M --gpu $g --load $l --deployment region --policies meridian-defaults,llm-d-precise --out $R/at-anchor-capacity/mooncake-$gpu --quiet"
	done
	for gpu in a100 h100; do
		g=$(gpu_flag $gpu)
		l=$(load_of capacity-$gpu-azure meridian-defaults 0.9 4)
		echo "--trace $A --gpu $g --load $l --deployment region --policies meridian-defaults,p-controller --out $R/at-0.9x-capacity/azure-$gpu --quiet"
		l=$(load_of capacity-$gpu meridian-defaults 0.9 4)
		echo "--trace $M --gpu $g --load $l --deployment region --policies meridian-defaults,p-controller --out $R/at-0.9x-capacity/mooncake-$gpu --quiet"
		l=$(load_of capacity-$gpu-mooncake-on-azure-arrivals meridian-defaults 0.9 4)
		echo "--trace $M --arrivals $A --gpu $g --load $l --deployment region --policies meridian-defaults,p-controller --out $R/at-0.9x-capacity/mooncake-on-azure-arrivals-$gpu --quiet"
	done
}

selected() { # args line
	[ -z "$only" ] && return 0
	local out=${1##*--out }
	grep -Eq -- "$only" <<<"${out%% *}"
}

if $list; then
	{ static_commands; derived_commands; } | while read -r line; do
		if selected "$line"; then echo "meridian-sim $line"; fi
	done
	exit 0
fi

mkdir -p .tools/bin
echo "results.sh: building meridian-sim" >&2
go build -o .tools/bin/meridian-sim ./sim/cmd/meridian-sim
export PATH="$PWD/.tools/bin:$PATH"

start=$(date +%s)
run_all() { # reads argument lines on stdin
	local lines=() line
	while read -r line; do
		if selected "$line"; then lines+=("$line"); fi
	done
	local i=0 t
	for line in "${lines[@]}"; do
		i=$((i + 1))
		t=$(date +%s)
		echo "results.sh [$i/${#lines[@]} of this step, $(( (t - start) / 60 ))m in] meridian-sim $line" >&2
		# shellcheck disable=SC2086 # the line is meridian-sim's arguments, split on spaces
		if ! meridian-sim $line >/dev/null; then
			echo "results.sh: failed: meridian-sim $line" >&2
			exit 1
		fi
		echo "results.sh:   done in $(( $(date +%s) - t ))s" >&2
	done
}
static_commands | run_all
derived_commands | run_all
echo "results.sh: every table regenerated in $(( ($(date +%s) - start) / 60 ))m; compare docs/results/README.md's figures with git diff docs/results" >&2
