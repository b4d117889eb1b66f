#!/usr/bin/env bash
# Whether sampled recording finds a steady leak, with its full stack,
# within 10 seconds: bench/src/steady_leak.c (1 MiB/s leaked from one
# stack, among traffic that does not leak through the same allocating
# function) under `trapline run --sample --watch=1 --timeout 10`, RUNS
# times. A run finds the leak when a look judges growing a site whose
# stack holds remember_session and handle_request: the full stack, not
# only the caller xmalloc that the cache shares. Prints, per run, the
# first look that found it; appends one row to bench/results.jsonl.
#
#   bench/sampled_leak.sh        (release build of this tree)
#
# Knobs (environment): RUNS=10, SAMPLE=512K.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/sampled_leak
RUNS=${RUNS:-10}
SAMPLE=${SAMPLE:-512K}
mkdir -p "$WORK"

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-agent >&2)
TRAPLINE=$ROOT/target/release/trapline
gcc -O2 -g -o "$WORK/steady_leak" "$BENCH_DIR/src/steady_leak.c"

results=$WORK/results.txt
: >"$results"
for run in $(seq "$RUNS"); do
    rm -f "$WORK"/s.trace*
    # Exit status 124: stopped by the timeout, as intended.
    "$TRAPLINE" run -q --force --sample="$SAMPLE" --watch=1 --timeout 10 \
        -o "$WORK/s.trace" -- "$WORK/steady_leak" >/dev/null 2>"$WORK/stderr" || [[ $? == 124 ]]
    found=$(python3 - "$WORK/s.trace.watch.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    look = json.loads(line)
    for site in look["sites"]:
        names = [f.get("function") for f in site["stack"]]
        if "growing" in site["verdicts"] and "remember_session" in names and "handle_request" in names:
            print(look["time_seconds"], site["growth"]["bytes_per_second"], site["bytes"], site.get("estimated_bytes", 0))
            sys.exit()
print("none")
PY
)
    echo "run $run: $found" >&2
    echo "$found" >>"$results"
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
CPU=$CPU COMMIT=$COMMIT SAMPLE=$SAMPLE python3 - "$results" "$ROOT/bench/results.jsonl" <<'PY'
import datetime, json, os, statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
found = [r for r in rows if r[0] != "none"]
now = datetime.datetime.now(datetime.timezone.utc)
row = {
    "date": now.strftime("%Y-%m-%d"), "time_utc": now.strftime("%H:%M"),
    "commit": os.environ["COMMIT"], "cpu": os.environ["CPU"],
    "workload": "steady_leak.c: 1 MiB/s leaked from one stack, run 10 s (bench/sampled_leak.sh)",
    "tool": f"trapline run --sample={os.environ['SAMPLE']} --watch=1",
    "runs": len(rows), "found_with_full_stack": len(found),
    "found_after_s": [float(r[0]) for r in found],
    "found_after_s_median": statistics.median(float(r[0]) for r in found) if found else None,
    "estimated_bytes_per_s": [round(float(r[1])) for r in found],
}
with open(sys.argv[2], "a") as out:
    out.write(json.dumps(row) + "\n")
print(f"found with the full stack in {len(found)} of {len(rows)} runs; after {row['found_after_s']} s")
PY
