#!/usr/bin/env bash
# What watching costs a running program: tests/fixtures/growth.c (20,000
# requests of a service's four allocation sites) natively, under
# `trapline run`, and under `trapline run --watch=SECS` (a watcher asking
# the agent for every site's live bytes every SECS seconds), interleaved
# round by round. The figure is the time the program's requests took, as
# it prints it (its throughput; not the start, the exit scan nor the
# watcher's last look). Prints the medians and appends one row per tool to
# bench/results.jsonl.
#
#   bench/watch.sh               (release build of this tree)
#
# Knobs (environment): ROUNDS=5, REQUESTS=200000 (about 6 s natively),
# INTERVAL=1 (the watcher's, seconds; its default).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/watch
ROUNDS=${ROUNDS:-5}
REQUESTS=${REQUESTS:-200000}
INTERVAL=${INTERVAL:-1}
mkdir -p "$WORK"

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-agent >&2)
TRAPLINE=$ROOT/target/release/trapline
gcc -O2 -g -o "$WORK/growth" "$ROOT/tests/fixtures/growth.c"

# seconds CMD...: the seconds the requests of CMD (growth or a trapline
# run of it) took, as growth prints them.
seconds() {
    "$@" 2>/dev/null | sed -n 's/^requests_s=//p'
}

results=$WORK/results.txt
: >"$results"
for _ in $(seq "$ROUNDS"); do
    echo "native $(seconds "$WORK/growth" "$REQUESTS")" >>"$results"
    echo "trapline $(seconds "$TRAPLINE" run -q --force -o "$WORK/t.trace" -- "$WORK/growth" "$REQUESTS")" >>"$results"
    echo "watched $(seconds "$TRAPLINE" run -q --force --watch="$INTERVAL" -o "$WORK/w.trace" -- "$WORK/growth" "$REQUESTS")" >>"$results"
done
looks=$(wc -l <"$WORK/w.trace.watch.jsonl")

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
CPU=$CPU COMMIT=$COMMIT INTERVAL=$INTERVAL LOOKS=$looks REQUESTS=$REQUESTS python3 - "$results" "$ROOT/bench/results.jsonl" <<'PY'
import datetime, json, os, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    tool, value = line.split()
    runs.setdefault(tool, []).append(float(value))
now = datetime.datetime.now(datetime.timezone.utc)
native = statistics.median(runs["native"])
trapline = statistics.median(runs["trapline"])
names = {"native": "native", "trapline": "trapline", "watched": f"trapline --watch={os.environ['INTERVAL']}"}
with open(sys.argv[2], "a") as out:
    for tool, values in runs.items():
        median = statistics.median(values)
        row = {
            "date": now.strftime("%Y-%m-%d"), "time_utc": now.strftime("%H:%M"),
            "commit": os.environ["COMMIT"], "cpu": os.environ["CPU"],
            "workload": f"watch: growth.c, {int(os.environ['REQUESTS']):,} requests of four allocation sites, time of the requests (bench/watch.sh)",
            "tool": names[tool], "rounds": len(values),
            "median_s": round(median, 3), "ratio_to_native": round(median / native, 3),
        }
        if tool == "watched":
            row["throughput_vs_trapline"] = round(trapline / median, 3)
            row["looks_last_run"] = int(os.environ["LOOKS"])
        row["values"] = values
        out.write(json.dumps(row) + "\n")
        print(names[tool], row["median_s"], "s", row["ratio_to_native"], "x native",
              row.get("throughput_vs_trapline", ""))
PY
