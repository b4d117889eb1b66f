#!/usr/bin/env bash
# What each layer of the agent costs on gcc's cc1 compiling sqlite3.c, in
# one interleaved run (see bench/README.md, "Layers").
#
#   bench/layers.sh
#
# Builds the agent three ways and runs, ROUNDS times each, in turn:
#   native      cc1 alone
#   forward     `trapline run` with an agent whose hooks pass every call
#               straight to the C library (feature `layer-forward`): the
#               cost of being preloaded, the trampolines and the thread lookup
#   no-stacks   every call recorded (live table, errors, events, writer),
#               no stack captured (feature `layer-no-stacks`)
#   no-release  the real agent, `--no-release-stacks`: allocation stacks only
#   full        the real agent, as `trapline run` runs by default
# and prints each variant's median and minimum wall time and their ratios to
# native. On a shared VM whose speed drifts from run to run, the minimum
# is the steadier of the two (noise only ever adds time).
#
# Knobs (environment):
#   ROUNDS=4             rounds
#   SQLITE_C=FILE        the file to compile (default: the registry's sqlite3.c)
#   NO_BUILD=1           use the agents already built in bench/work/layers
#
# About 2.5 minutes per round.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/sqlite.sh
. "$BENCH_DIR/sqlite.sh"
WORK=$BENCH_DIR/work/layers
ROUNDS=${ROUNDS:-4}

log() { printf '[bench layers] %s\n' "$*" >&2; }

mkdir -p "$WORK"
if [[ -z ${SQLITE_C:-} ]]; then
    SQLITE_C=$(registry_sqlite_c)
fi
[[ -f ${SQLITE_C:-} ]] || { log "no sqlite3.c (set SQLITE_C, or run bench/run.sh cc1 once)"; exit 1; }
CC1=$(gcc -print-prog-name=cc1)
MULTIARCH=$(gcc -print-multiarch)

# Copies of everything measured, so that a build during the run changes nothing.
if [[ -z ${NO_BUILD:-} ]]; then
    log "building"
    (cd "$ROOT" && cargo build --release -q >&2)
    cp "$ROOT/target/release/trapline" "$WORK/trapline"
    cp "$ROOT/target/release/libtrapline_agent.so" "$WORK/full.so"
    for feature in layer-forward layer-no-stacks; do
        (cd "$ROOT" && CARGO_TARGET_DIR=$WORK/target-$feature \
            cargo build --release -q -p trapline-agent --features "$feature" >&2)
        cp "$WORK/target-$feature/release/libtrapline_agent.so" "$WORK/$feature.so"
    done
fi

run_variant() {
    local cc1=("$CC1" -quiet -imultiarch "$MULTIARCH" -O2 "$SQLITE_C" -o "$WORK/out.s")
    local tl=("$WORK/trapline" run -q -o "$WORK/trace")
    case $1 in
        native) "${cc1[@]}" ;;
        forward) TRAPLINE_AGENT=$WORK/layer-forward.so "${tl[@]}" -- "${cc1[@]}" ;;
        no-stacks) TRAPLINE_AGENT=$WORK/layer-no-stacks.so "${tl[@]}" -- "${cc1[@]}" ;;
        no-release) TRAPLINE_AGENT=$WORK/full.so "${tl[@]}" --no-release-stacks -- "${cc1[@]}" ;;
        full) TRAPLINE_AGENT=$WORK/full.so "${tl[@]}" -- "${cc1[@]}" ;;
    esac
}

log "cc1 on $SQLITE_C, $ROUNDS rounds ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
for round in $(seq "$ROUNDS"); do
    for variant in native forward no-stacks no-release full; do
        start=$EPOCHREALTIME
        run_variant "$variant" >/dev/null 2>&1 || log "$variant exited with $?"
        echo "$variant $(echo "$EPOCHREALTIME - $start" | bc)"
    done
done | tee "$WORK/times.txt" | python3 -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    variant, seconds = line.split()
    runs.setdefault(variant, []).append(float(seconds))
med0, min0 = statistics.median(runs["native"]), min(runs["native"])
print("%-11s %9s %7s %9s %7s  %s" % ("variant", "median s", "ratio", "min s", "ratio", "all"))
for variant, v in runs.items():
    print("%-11s %9.2f %6.2fx %9.2f %6.2fx  %s" % (variant, statistics.median(v), statistics.median(v) / med0,
          min(v), min(v) / min0, " ".join("%.2f" % s for s in v)))
'
