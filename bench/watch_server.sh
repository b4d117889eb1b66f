#!/usr/bin/env bash
# What watching costs a threaded server: tests/fixtures/leaky_server.c (two
# workers answering a local client as fast as they can) natively, under
# `trapline run`, and under `trapline run --watch=1 --stale-after=SECS`
# (growth from every look, and old blocks of the growing sites watched for
# accesses through userfaultfd, within the default 1% fault budget),
# interleaved round by round. The figure is the time the requests took, as
# the server prints it. Prints the medians and appends one row per tool to
# bench/results.jsonl, the watched row with the faults and the time in
# faults of its last run.
#
#   bench/watch_server.sh        (release build of this tree)
#
# Knobs (environment): ROUNDS=3, REQUESTS=1500000 (about 30 s natively),
# STALE_AFTER=4.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/watch_server
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-1500000}
STALE_AFTER=${STALE_AFTER:-4}
mkdir -p "$WORK"

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-agent >&2)
TRAPLINE=$ROOT/target/release/trapline
gcc -O2 -g -pthread -o "$WORK/leaky_server" "$ROOT/tests/fixtures/leaky_server.c"

# seconds CMD...: the seconds the requests took, as the server prints them.
seconds() {
    "$@" 2>/dev/null | sed -n 's/^served=[0-9]* seconds=\([0-9.]*\).*/\1/p'
}

results=$WORK/results.txt
: >"$results"
for _ in $(seq "$ROUNDS"); do
    echo "native $(seconds "$WORK/leaky_server" 0 "$REQUESTS")" >>"$results"
    echo "trapline $(seconds "$TRAPLINE" run -q --force -o "$WORK/t.trace" -- "$WORK/leaky_server" 0 "$REQUESTS")" >>"$results"
    echo "watched $(seconds "$TRAPLINE" run -q --force --watch=1 --stale-after="$STALE_AFTER" -o "$WORK/w.trace" -- "$WORK/leaky_server" 0 "$REQUESTS")" >>"$results"
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
CPU=$CPU COMMIT=$COMMIT STALE_AFTER=$STALE_AFTER REQUESTS=$REQUESTS python3 - "$results" "$ROOT/bench/results.jsonl" "$WORK/w.trace.watch.jsonl" <<'PY'
import datetime, json, os, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    tool, value = line.split()
    runs.setdefault(tool, []).append(float(value))
looks = [json.loads(l) for l in open(sys.argv[3]) if l.strip()]
last = looks[-1]
monitor = last.get("monitor") or {}
now = datetime.datetime.now(datetime.timezone.utc)
native = statistics.median(runs["native"])
trapline = statistics.median(runs["trapline"])
names = {"native": "native", "trapline": "trapline",
         "watched": f"trapline --watch=1 --stale-after={os.environ['STALE_AFTER']}"}
with open(sys.argv[2], "a") as out:
    for tool, values in runs.items():
        median = statistics.median(values)
        row = {
            "date": now.strftime("%Y-%m-%d"), "time_utc": now.strftime("%H:%M"),
            "commit": os.environ["COMMIT"], "cpu": os.environ["CPU"],
            "workload": f"watch: leaky_server.c, 2 workers, {int(os.environ['REQUESTS']):,} requests, time of the requests (bench/watch_server.sh)",
            "tool": names[tool], "rounds": len(values),
            "median_s": round(median, 3), "ratio_to_native": round(median / native, 3),
        }
        if tool == "watched":
            row["throughput_vs_trapline"] = round(trapline / median, 3)
            row["looks_last_run"] = last["looks"]
            row["faults_last_run"] = monitor.get("faults", 0)
            row["fault_and_arm_seconds_last_run"] = round(monitor.get("fault_seconds", 0.0), 4)
            row["pages_watched_at_last_look"] = monitor.get("armed_pages", 0)
            row["stale_sites_last_look"] = sum("stale" in s["verdicts"] for s in last["sites"])
        row["values"] = values
        out.write(json.dumps(row) + "\n")
        print(names[tool], row["median_s"], "s", row["ratio_to_native"], "x native",
              row.get("throughput_vs_trapline", ""), row.get("faults_last_run", ""),
              row.get("fault_and_arm_seconds_last_run", ""))
PY
