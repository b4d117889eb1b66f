#!/usr/bin/env bash
# What the detour of an allocator linked into the executable costs:
# bench/src/threads_pairs.c (PAIRS malloc+free pairs in one thread) built
# three ways, each natively and under `trapline run`, interleaved ROUNDS
# times: on glibc's malloc; on jemalloc's shared library (-ljemalloc: the
# hooks are reached through symbol lookup); and on jemalloc's archive
# linked into the executable (its entry points detoured). The figure is
# the time the pairs took, as the program prints it. Appends one row to
# bench/results.jsonl with the medians and the nanoseconds trapline adds
# per pair on each build.
#
#   bench/detour.sh        (release build of this tree)
#
# Knobs (environment): ROUNDS=5, PAIRS=5000000.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/detour
ROUNDS=${ROUNDS:-5}
PAIRS=${PAIRS:-5000000}
mkdir -p "$WORK"

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-agent >&2)
TRAPLINE=$ROOT/target/release/trapline
export TRAPLINE_AGENT=$ROOT/target/release/libtrapline_agent.so
SRC=$BENCH_DIR/src/threads_pairs.c
ARCHIVE=/usr/lib/x86_64-linux-gnu/libjemalloc.a
gcc -O2 -g -pthread -o "$WORK/glibc" "$SRC"
gcc -O2 -g -pthread -o "$WORK/jemalloc_library" "$SRC" -Wl,--no-as-needed -ljemalloc
gcc -O2 -g -pthread -o "$WORK/jemalloc_inside" "$SRC" \
    -Wl,--whole-archive "$ARCHIVE" -Wl,--no-whole-archive -lm -ldl -lstdc++

results=$WORK/results.txt
: >"$results"
for round in $(seq "$ROUNDS"); do
    for build in glibc jemalloc_library jemalloc_inside; do
        native=$("$WORK/$build" "$PAIRS" 1)
        traced=$("$TRAPLINE" run -q --force -o "$WORK/t.trace" -- "$WORK/$build" "$PAIRS" 1)
        echo "$build native $native" >>"$results"
        echo "$build trapline $traced" >>"$results"
    done
    echo "round $round done" >&2
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
CPU=$CPU COMMIT=$COMMIT PAIRS=$PAIRS PYTHONPATH=$BENCH_DIR python3 - "$results" "$ROOT/bench/results.jsonl" <<'PY'
import json, os, statistics, sys
import loop_times
times = loop_times.read(sys.argv[1])
pairs = int(os.environ["PAIRS"])
row = {
    **loop_times.stamp(),
    "workload": f"threads_pairs.c, {pairs:,} malloc+free pairs in 1 thread, on glibc, jemalloc's library and jemalloc's archive in the executable (bench/detour.sh)",
    "tool": "trapline run", "rounds": len(times["glibc"]["native"]),
    "seconds": times,
    "median_s": {b: {t: round(statistics.median(v), 4) for t, v in tools.items()} for b, tools in times.items()},
}
row["ns_added_per_pair_by_build"] = {
    b: round((m["trapline"] - m["native"]) / pairs * 1e9, 1) for b, m in row["median_s"].items()
}
with open(sys.argv[2], "a") as out:
    out.write(json.dumps(row) + "\n")
print(json.dumps({k: row[k] for k in ("median_s", "ns_added_per_pair_by_build")}, indent=1))
PY
