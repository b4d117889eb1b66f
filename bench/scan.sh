#!/usr/bin/env bash
# The reachability scan's pause: a heap of SCAN_N blocks (default 10 million,
# 1 GiB) scanned at exit. Reports, per repetition, the pause the agent measured
# (program threads stopped and the live table locked: copy, sort, roots,
# marking, cliques) from `trapline leaks --format json`, and the run's wall
# time native vs under trapline; then the medians.
#
#   bench/scan.sh            (also: bench/run.sh scan)
#
# Knobs: SCAN_N=10000000, SCAN_REPS=3, TRAPLINE=PATH (default
# target/release/trapline), NO_BUILD=1.
# A measurement, not a test: nothing here asserts on timings.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/scan
SCAN_N=${SCAN_N:-10000000}
SCAN_REPS=${SCAN_REPS:-3}
TRAPLINE=${TRAPLINE:-$ROOT/target/release/trapline}

mkdir -p "$WORK"
if [ "${NO_BUILD:-0}" != 1 ]; then
    (cd "$ROOT" && cargo build --release -p trapline-cli -p trapline-agent >&2)
fi
gcc -O2 -o "$WORK/scan_heap" "$BENCH_DIR/src/scan_heap.c"

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
seconds() { local t0=$EPOCHREALTIME; "$@" > /dev/null 2>&1; echo "$EPOCHREALTIME $t0" | awk '{ printf "%.3f\n", $1 - $2 }'; }

echo "machine: $(nproc) cpus, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "heap: $SCAN_N blocks of 16..199 bytes, 1% of them in a lost list"
pauses=() natives=() traced=()
for rep in $(seq 1 "$SCAN_REPS"); do
    natives+=("$(seconds "$WORK/scan_heap" "$SCAN_N")")
    traced+=("$(seconds "$TRAPLINE" run -q -o "$WORK/scan.trace" -- "$WORK/scan_heap" "$SCAN_N")")
    json=$("$TRAPLINE" leaks --format json "$WORK/scan.trace")
    pause=$(printf '%s' "$json" | python3 -c '
import json, sys
r = json.load(sys.stdin)
s, k = r["scan"], r["summary"]
print("%.1f %d %d %d %d" % (s["pause_ms"], s["blocks"], s["bytes"], k["definitely_lost"]["blocks"], k["indirectly_lost"]["blocks"]))')
    read -r ms blocks bytes definite indirect <<< "$pause"
    pauses+=("$ms")
    echo "rep $rep: pause ${ms} ms for $blocks blocks, $bytes bytes (definitely lost $definite, indirectly lost $indirect); wall native ${natives[-1]} s, trapline ${traced[-1]} s"
done
echo "median pause: $(printf '%s\n' "${pauses[@]}" | median) ms; median wall: native $(printf '%s\n' "${natives[@]}" | median) s, trapline $(printf '%s\n' "${traced[@]}" | median) s"
rm -f "$WORK/scan.trace"
