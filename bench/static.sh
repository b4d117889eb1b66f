#!/usr/bin/env bash
# What recording a statically linked program from outside costs (ptrace
# stops at each trapped call, crates/tracer) next to the agent on the same
# program built dynamically: bench/src/threads_pairs.c (PAIRS malloc+free
# pairs in one thread) built with and without -static, each run natively
# and under `trapline run`, and the dynamic build under valgrind's memcheck
# (which cannot see a static program's malloc at all), interleaved ROUNDS
# times. The figure is the time the pairs took, as the program prints it.
# Appends one row to bench/results.jsonl with the medians and the
# microseconds each tool adds per pair.
#
#   bench/static.sh        (release build of this tree)
#
# Knobs (environment): ROUNDS=5, PAIRS=20000.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/static
ROUNDS=${ROUNDS:-5}
PAIRS=${PAIRS:-20000}
mkdir -p "$WORK"

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-agent >&2)
TRAPLINE=$ROOT/target/release/trapline
export TRAPLINE_AGENT=$ROOT/target/release/libtrapline_agent.so
SRC=$BENCH_DIR/src/threads_pairs.c
gcc -O2 -g -pthread -o "$WORK/dynamic" "$SRC"
gcc -O2 -g -pthread -static -o "$WORK/static" "$SRC"

results=$WORK/results.txt
: >"$results"
for round in $(seq "$ROUNDS"); do
    for build in static dynamic; do
        echo "$build native $("$WORK/$build" "$PAIRS" 1)" >>"$results"
        echo "$build trapline $("$TRAPLINE" run -q --force -o "$WORK/t.trace" -- "$WORK/$build" "$PAIRS" 1)" >>"$results"
    done
    echo "dynamic memcheck $(valgrind -q --leak-check=no "$WORK/dynamic" "$PAIRS" 1 2>/dev/null)" >>"$results"
    echo "round $round done" >&2
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
CPU=$CPU COMMIT=$COMMIT PAIRS=$PAIRS PYTHONPATH=$BENCH_DIR python3 - "$results" "$ROOT/bench/results.jsonl" <<'PY'
import json, os, statistics, sys
import loop_times
times = loop_times.read(sys.argv[1])
pairs = int(os.environ["PAIRS"])
stamp = loop_times.stamp()
names = {
    ("static", "native"): "native (static build)",
    ("static", "trapline"): "trapline run (static build, from outside)",
    ("dynamic", "native"): "native (dynamic build)",
    ("dynamic", "trapline"): "trapline run (dynamic build, the agent)",
    ("dynamic", "memcheck"): "valgrind 3.19.0 memcheck (dynamic build)",
}
with open(sys.argv[2], "a") as out:
    for (build, tool), name in names.items():
        secs = times[build][tool]
        row = {
            **stamp,
            "workload": f"threads_pairs.c, {pairs:,} malloc+free pairs in 1 thread, built static (recorded from outside) and dynamic (the agent) (bench/static.sh)",
            "tool": name, "rounds": len(secs), "seconds": secs,
            "median_s": round(statistics.median(secs), 5),
        }
        if tool != "native":
            native = statistics.median(times[build]["native"])
            row["us_added_per_pair"] = round((statistics.median(secs) - native) / pairs * 1e6, 3)
        out.write(json.dumps(row) + "\n")
        print(name, row.get("us_added_per_pair", row["median_s"]))
PY
