#!/usr/bin/env bash
# Two revisions' agents against native, interleaved in one run: the micro
# benchmark (bench/src/depth.c: malloc+free pairs at call depth 20) and gcc's
# cc1 -O2 on sqlite3.c, a slice and the whole file. For a change that must
# leave the overhead as it was.
#
#   bench/ab.sh OLD NEW      (git revisions; `.` is the working tree)
#
# Each agent is built in release mode from its revision and preloaded
# directly (LD_PRELOAD, TRAPLINE_OUTPUT), so that only the agents differ.
# Every round runs native, OLD and NEW once each, so that a drift of the
# machine's speed hits all three alike. Prints the medians and appends one
# row per workload and tool to bench/results.jsonl (bench/ab_rows.py).
#
# Knobs (environment):
#   MICRO_ROUNDS=9 MICRO_N=5000000   the micro benchmark
#   SLICE_ROUNDS=9 SLICE_FROM=40000  cc1 on a slice of sqlite3.c (as bench/cachegrind.sh)
#   CC1_ROUNDS=3                     cc1 on the whole sqlite3.c (0: skip)
#   SQLITE_C=FILE                    sqlite3.c (default: fetched through cargo)
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/sqlite.sh
. "$BENCH_DIR/sqlite.sh"
WORK=$BENCH_DIR/work/ab
MICRO_ROUNDS=${MICRO_ROUNDS:-9}
MICRO_N=${MICRO_N:-5000000}
SLICE_ROUNDS=${SLICE_ROUNDS:-9}
SLICE_FROM=${SLICE_FROM:-40000}
CC1_ROUNDS=${CC1_ROUNDS:-3}

log() { printf '[bench ab] %s\n' "$*" >&2; }
[[ $# -eq 2 ]] || { echo "usage: bench/ab.sh OLD NEW" >&2; exit 2; }
mkdir -p "$WORK"

build_agent() {
    local rev=$1 label=$2 src=$ROOT
    if [[ $rev != . ]]; then
        src=$WORK/src-$label
        rm -rf "$src"
        git -C "$ROOT" worktree add -q -f --detach "$src" "$rev"
    fi
    log "building the agent of $rev"
    (cd "$src" && CARGO_TARGET_DIR=$WORK/target-$label cargo build --release -q -p trapline-agent >&2)
    if [[ $rev != . ]]; then
        git -C "$ROOT" worktree remove --force "$src"
    fi
    cp "$WORK/target-$label/release/libtrapline_agent.so" "$WORK/$label.so"
}

commit_of() {
    if [[ $1 == . ]]; then
        echo "$(git -C "$ROOT" rev-parse --short HEAD)+worktree"
    else
        git -C "$ROOT" rev-parse --short "$1"
    fi
}

OLD=$(commit_of "$1")
NEW=$(commit_of "$2")
build_agent "$1" old
build_agent "$2" new
gcc -O2 -fomit-frame-pointer -g -o "$WORK/depth" "$BENCH_DIR/src/depth.c"
SQLITE_C=${SQLITE_C:-$(registry_sqlite_c || true)}
if [[ ! -f ${SQLITE_C:-} ]]; then
    SQLITE_C=$(fetch_sqlite_into "$WORK/sqlite-fetch")
fi
SLICE=$WORK/sqlite3-slice.c
slice_end=$(cut_sqlite_slice "$SQLITE_C" "$SLICE" "$SLICE_FROM")
CC1=$(gcc -print-prog-name=cc1)
MULTIARCH=$(gcc -print-multiarch)

# run TOOL CMD...: the command under TOOL (native, old, new), its stdout and
# stderr in out.txt and err.txt; prints the wall seconds.
run() {
    local tool=$1 start end
    shift
    rm -f "$WORK"/trace.*
    start=$(date +%s.%N)
    if [[ $tool == native ]]; then
        "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"
    else
        LD_PRELOAD=$WORK/$tool.so TRAPLINE_OUTPUT=$WORK/trace "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"
    fi
    end=$(date +%s.%N)
    echo "$start $end" | awk '{ printf "%.4f\n", $2 - $1 }'
}

results=$WORK/results.txt
: >"$results"
log "micro: $MICRO_ROUNDS rounds of $MICRO_N pairs"
for _ in $(seq "$MICRO_ROUNDS"); do
    for tool in native old new; do
        run "$tool" "$WORK/depth" "$MICRO_N" >/dev/null
        echo "micro $tool $(sed -n 's/.*ns_per_pair=\([0-9.]*\).*/\1/p' "$WORK/out.txt")" >>"$results"
    done
done
cc1() {
    run "$1" "$CC1" -quiet -imultiarch "$MULTIARCH" -O2 "$2" -o "$WORK/out.s"
}
log "cc1 on the first $slice_end lines of sqlite3.c: $SLICE_ROUNDS rounds"
for _ in $(seq "$SLICE_ROUNDS"); do
    for tool in native old new; do
        echo "slice $tool $(cc1 "$tool" "$SLICE")" >>"$results"
    done
done
log "cc1 on the whole sqlite3.c: $CC1_ROUNDS rounds"
for _ in $(seq "$CC1_ROUNDS"); do
    for tool in native old new; do
        echo "cc1 $tool $(cc1 "$tool" "$SQLITE_C")" >>"$results"
    done
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
OLD=$OLD NEW=$NEW CPU=$CPU SLICE_END=$slice_end MICRO_N=$MICRO_N \
    python3 "$BENCH_DIR/ab_rows.py" "$results" "$ROOT/bench/results.jsonl"
