#!/usr/bin/env bash
# What each layer of the agent costs, in one interleaved run (see
# bench/README.md, "Layers"): on gcc's cc1 compiling sqlite3.c (default), or
# on the depth-20 malloc+free microbenchmark (WORKLOAD=micro).
#
#   bench/layers.sh
#   WORKLOAD=micro bench/layers.sh
#
# Builds the agent three ways and runs, ROUNDS times each, in turn:
#   native      the workload alone
#   forward     `trapline run` with an agent whose hooks pass every call
#               straight to the C library (feature `layer-forward`): the
#               cost of being preloaded, the trampolines and the thread lookup
#   no-stacks   every call recorded (live table, errors, events, writer),
#               no stack captured (feature `layer-no-stacks`)
#   no-release  the real agent, `--no-release-stacks`: allocation stacks only
#   full        the real agent, as `trapline run` runs by default
# cc1: prints each variant's median and minimum wall time and their ratios to
# native. On a shared VM whose speed drifts from run to run, the minimum
# is the steadier of the two (noise only ever adds time).
# micro: prints each variant's median and minimum ns per pair, timed by the
# program around its loop, and the ns each adds to native's.
#
# Knobs (environment):
#   WORKLOAD=cc1|micro   what to run (default cc1)
#   ROUNDS=4             rounds (micro: default 9)
#   SQLITE_C=FILE        cc1: the file to compile (default: the registry's sqlite3.c)
#   MICRO_N=5000000      micro: malloc+free pairs per run
#   NO_BUILD=1           use the agents already built in bench/work/layers
#   VARIANTS="native forward no-stacks no-release full"   which to run, in order
#
# cc1: about 2.5 minutes per round; micro: about 3 seconds per round.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/sqlite.sh
. "$BENCH_DIR/sqlite.sh"
WORK=$BENCH_DIR/work/layers
WORKLOAD=${WORKLOAD:-cc1}
case $WORKLOAD in
    cc1) ROUNDS=${ROUNDS:-4} ;;
    micro) ROUNDS=${ROUNDS:-9} ;;
    *) echo "bench/layers.sh: WORKLOAD must be cc1 or micro, not '$WORKLOAD'" >&2; exit 2 ;;
esac
MICRO_N=${MICRO_N:-5000000}
VARIANTS=${VARIANTS:-native forward no-stacks no-release full}

log() { printf '[bench layers] %s\n' "$*" >&2; }

mkdir -p "$WORK"
if [[ $WORKLOAD == cc1 ]]; then
    if [[ -z ${SQLITE_C:-} ]]; then
        SQLITE_C=$(registry_sqlite_c)
    fi
    [[ -f ${SQLITE_C:-} ]] || { log "no sqlite3.c (set SQLITE_C, or run bench/run.sh cc1 once)"; exit 1; }
    CC1=$(gcc -print-prog-name=cc1)
    MULTIARCH=$(gcc -print-multiarch)
else
    # Built as bench/run.sh builds it: -O2, no frame pointers, like Debian's binaries.
    gcc -O2 -fomit-frame-pointer -g -o "$WORK/depth" "$BENCH_DIR/src/depth.c"
fi

# Copies of everything measured, so that a build during the run changes nothing.
if [[ -z ${NO_BUILD:-} ]]; then
    log "building"
    (cd "$ROOT" && cargo build --release -q >&2)
    cp "$ROOT/target/release/trapline" "$WORK/trapline"
    cp "$ROOT/target/release/libtrapline_agent.so" "$WORK/full.so"
    features=(layer-forward layer-no-stacks)
    for feature in "${features[@]}"; do
        (cd "$ROOT" && CARGO_TARGET_DIR=$WORK/target-$feature \
            cargo build --release -q -p trapline-agent --features "$feature" >&2)
        cp "$WORK/target-$feature/release/libtrapline_agent.so" "$WORK/$feature.so"
    done
fi

run_variant() {
    local cmd
    if [[ $WORKLOAD == cc1 ]]; then
        cmd=("$CC1" -quiet -imultiarch "$MULTIARCH" -O2 "$SQLITE_C" -o "$WORK/out.s")
    else
        cmd=("$WORK/depth" "$MICRO_N")
    fi
    local tl=("$WORK/trapline" run -q -o "$WORK/trace")
    case $1 in
        native) "${cmd[@]}" ;;
        forward) TRAPLINE_AGENT=$WORK/layer-forward.so "${tl[@]}" -- "${cmd[@]}" ;;
        no-stacks) TRAPLINE_AGENT=$WORK/layer-no-stacks.so "${tl[@]}" -- "${cmd[@]}" ;;
        no-release) TRAPLINE_AGENT=$WORK/full.so "${tl[@]}" --no-release-stacks -- "${cmd[@]}" ;;
        full) TRAPLINE_AGENT=$WORK/full.so "${tl[@]}" -- "${cmd[@]}" ;;
        *) log "unknown variant $1"; return 2 ;;
    esac
}

# Prints "variant value" per run: seconds of wall time (cc1), or the ns per
# pair the program timed around its loop (micro).
measure_rounds() {
    local variant start out
    for round in $(seq "$ROUNDS"); do
        for variant in $VARIANTS; do
            if [[ $WORKLOAD == cc1 ]]; then
                start=$EPOCHREALTIME
                run_variant "$variant" >/dev/null 2>&1 || log "$variant exited with $?"
                echo "$variant $(echo "$EPOCHREALTIME - $start" | bc)"
            else
                out=$(run_variant "$variant" 2>/dev/null) || log "$variant exited with $?"
                if [[ $out =~ ns_per_pair=([0-9.]+) ]]; then
                    echo "$variant ${BASH_REMATCH[1]}"
                else
                    log "$variant printed no ns_per_pair: $out"
                fi
            fi
        done
    done
}

# Medians and minima of "variant value" lines, against native's: what each
# variant adds in ns per pair (micro), or its ratio of wall time (cc1).
summarize() {
    python3 -c '
import statistics, sys
micro = sys.argv[1] == "micro"
runs = {}
for line in sys.stdin:
    variant, value = line.split()
    runs.setdefault(variant, []).append(float(value))
med0, min0 = statistics.median(runs["native"]), min(runs["native"])
if micro:
    print("%-11s %10s %10s %8s %8s  %s" % ("variant", "median ns", "added", "min ns", "added", "all (ns per pair)"))
else:
    print("%-11s %9s %7s %9s %7s  %s" % ("variant", "median s", "ratio", "min s", "ratio", "all"))
for variant, v in runs.items():
    med, low = statistics.median(v), min(v)
    if micro:
        print("%-11s %10.2f %10.2f %8.2f %8.2f  %s" % (variant, med, med - med0, low, low - min0,
              " ".join("%.1f" % x for x in v)))
    else:
        print("%-11s %9.2f %6.2fx %9.2f %6.2fx  %s" % (variant, med, med / med0, low, low / min0,
              " ".join("%.2f" % x for x in v)))
' "$WORKLOAD"
}

if [[ $WORKLOAD == micro ]]; then
    log "micro: depth 20, $MICRO_N pairs, $ROUNDS rounds ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
    measure_rounds | tee "$WORK/micro-ns.txt" | summarize
else
    log "cc1 on $SQLITE_C, $ROUNDS rounds ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
    measure_rounds | tee "$WORK/times.txt" | summarize
fi
