#!/usr/bin/env bash
# Cycles per changed stack capture on gcc's cc1, timed where they are spent
# (see bench/README.md, "Timed at the capture").
#
#   bench/capture_cycles.sh [REV ...]    (default: the working tree)
#
# Builds the agent of each git revision (or of the working tree, for the
# argument `.`) with the `capture-timing` feature, which reads the TSC around
# every capture whose stack changed, and around every recorded allocation
# and release call, and prints the counts and the cycles per capture and per
# call at exit. Then runs cc1 on the same slice of sqlite3.c as
# bench/cachegrind.sh, ROUNDS times, one run of every agent per round
# (interleaved, so a drift of the machine's speed hits all of them alike),
# and prints each agent's median and all its values.
#
# Knobs (environment):
#   ROUNDS=5             rounds
#   SLICE_FROM=40000     as in bench/cachegrind.sh
#   SQLITE_C=FILE        as in bench/cachegrind.sh
#
# The numbers are TSC cycles (the counter's fixed rate, not the core's clock)
# and include the two counter reads. One round takes about 5 s per agent.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/sqlite.sh
. "$BENCH_DIR/sqlite.sh"
WORK=$BENCH_DIR/work/capture_cycles
ROUNDS=${ROUNDS:-5}
SLICE_FROM=${SLICE_FROM:-40000}

log() { printf '[bench capture_cycles] %s\n' "$*" >&2; }

mkdir -p "$WORK"
if [[ -z ${SQLITE_C:-} ]]; then
    SQLITE_C=$(registry_sqlite_c)
fi
[[ -f ${SQLITE_C:-} ]] || { log "no sqlite3.c (set SQLITE_C, or run bench/run.sh cc1 once)"; exit 1; }
SLICE=$WORK/sqlite3-slice.c
end=$(cut_sqlite_slice "$SQLITE_C" "$SLICE" "$SLICE_FROM")
CC1=$(gcc -print-prog-name=cc1)
MULTIARCH=$(gcc -print-multiarch)

revs=("$@")
[[ ${#revs[@]} -gt 0 ]] || revs=(.)
agents=()
for rev in "${revs[@]}"; do
    label=$(echo "$rev" | tr -c 'A-Za-z0-9_.\n-' _)
    [[ $rev == . ]] && label=worktree
    src=$ROOT
    if [[ $rev != . ]]; then
        src=$WORK/src-$label
        rm -rf "$src"
        git -C "$ROOT" worktree add -q -f --detach "$src" "$rev"
    fi
    log "building $rev"
    (cd "$src" && CARGO_TARGET_DIR=$WORK/target-$label \
        cargo build --release -q -p trapline-agent --features capture-timing >&2)
    [[ $rev != . ]] && git -C "$ROOT" worktree remove --force "$src"
    cp "$WORK/target-$label/release/libtrapline_agent.so" "$WORK/$label.so"
    agents+=("$label")
done

log "cc1 on the first $end lines of $SQLITE_C, $ROUNDS rounds"
for round in $(seq "$ROUNDS"); do
    for label in "${agents[@]}"; do
        # Each run writes TRACE.<pid> (no `trapline run` to name it): keep only the last.
        rm -f "$WORK/$label.trace".*
        LD_PRELOAD=$WORK/$label.so TRAPLINE_OUTPUT=$WORK/$label.trace \
            "$CC1" -quiet -imultiarch "$MULTIARCH" -O2 "$SLICE" -o "$WORK/$label.s" 2>&1 >/dev/null |
            sed -n "s/.*capture-timing: \([0-9]*\) changed captures, [0-9]* TSC cycles, \([0-9]*\) per capture; \([0-9]*\) allocation calls, \([0-9]*\) per call; \([0-9]*\) release calls, \([0-9]*\) per call/$label \1 \2 \3 \4 \5 \6/p"
    done
done | python3 -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    label, *v = line.split()
    runs.setdefault(label, []).append(list(map(int, v)))
for label, v in runs.items():
    med = lambda i: statistics.median(r[i] for r in v)
    each = lambda i: " ".join(str(r[i]) for r in v)
    print("%-12s medians of %d rounds: %d changed captures, %d cycles each; %d allocation calls, %d cycles each; %d release calls, %d cycles each"
          % (label, len(v), v[0][0], med(1), v[0][2], med(3), v[0][4], med(5)))
    print("%-12s   by round: captures %s | allocations %s | releases %s" % ("", each(1), each(3), each(5)))
'
