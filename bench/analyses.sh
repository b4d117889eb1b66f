#!/usr/bin/env bash
# Each analysis of one real service's trace, timed with its peak RSS:
# stats, leaks, locks, deadlocks, export --format pprof and report, on
# TRACE (default: bench/perfetto.sh's memcached trace), interleaved round
# by round; with HEAPTRACK_FILE (heaptrack's recording of the same program
# and workload), heaptrack_print on it too, the anchor. Every read starts
# without TRACE.idx but locks+idx and deadlocks+idx, which run right after
# locks and deadlocks with the index those left. Appends one row to
# bench/results.jsonl.
#
#   bench/analyses.sh [TRACE]
#   PYTHONMALLOC=malloc trapline run -o py.trace -- python3.11 work.py
#   PYTHONMALLOC=malloc heaptrack -o py python3.11 work.py
#   HEAPTRACK_FILE=py.zst WORKLOAD="python3.11 work.py" bench/analyses.sh py.trace
#
# Knobs (environment): ROUNDS=3, HEAPTRACK_FILE, WORKLOAD (what TRACE ran),
# SYNTHETIC_BYTES=N (TRACE is then a synthetic service's trace of N bytes,
# written by crates/trace/examples/synthetic_trace.rs, as tests/scale.rs's).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
ROUNDS=${ROUNDS:-3}
TRACE=${1:-$BENCH_DIR/work/perfetto/memcached.trace}
WORK=$BENCH_DIR/work/analyses
mkdir -p "$WORK"
if [ -n "${SYNTHETIC_BYTES:-}" ]; then
    TRACE=$WORK/synthetic-$SYNTHETIC_BYTES.trace
    WORKLOAD="synthetic service (trapline_trace::synthetic, 4 threads, 4,096 live blocks)"
    (cd "$ROOT" && cargo build --release -q -p trapline-trace --example synthetic_trace >&2)
    [ -f "$TRACE" ] || "$ROOT/target/release/examples/synthetic_trace" "$TRACE" "$SYNTHETIC_BYTES" >&2
fi
[ -f "$TRACE" ] || { echo "no trace at $TRACE: run bench/perfetto.sh first, or name one" >&2; exit 2; }

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-agent >&2)
TRAPLINE=$ROOT/target/release/trapline
results=$WORK/results.txt
: >"$results"
for _ in $(seq "$ROUNDS"); do
    for what in stats leaks locks locks+idx deadlocks deadlocks+idx pprof report ${HEAPTRACK_FILE:+heaptrack_print}; do
        case $what in
            *+idx) cmd=("${what%+idx}" "$TRACE") ;;
            *) rm -f "$TRACE.idx" ;;
        esac
        case $what in
            *+idx) ;;
            heaptrack_print)
                /usr/bin/time -f "$what %e %M" -a -o "$results" heaptrack_print "$HEAPTRACK_FILE" >/dev/null
                continue ;;
            pprof) cmd=(export "$TRACE" --format pprof --force -o "$WORK/heap.pb.gz") ;;
            report) cmd=(report "$TRACE" --force -o "$WORK/report.html") ;;
            *) cmd=("$what" "$TRACE") ;;
        esac
        /usr/bin/time -f "$what %e %M" -a -o "$results" "$TRAPLINE" "${cmd[@]}" >/dev/null
    done
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
EVENTS=$("$TRAPLINE" stats --format json "$TRACE" | python3 -c 'import json,sys; print(json.load(sys.stdin)["trace"]["events"])')
CPU=$CPU COMMIT=$COMMIT EVENTS=$EVENTS WORKLOAD=${WORKLOAD:-} python3 - "$results" "$TRACE" "$ROOT/bench/results.jsonl" <<'PY'
import datetime, json, os, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    what, secs, kb = line.split()
    runs.setdefault(what, []).append((float(secs), int(kb)))
now = datetime.datetime.now(datetime.timezone.utc)
row = {
    "date": now.strftime("%Y-%m-%d"), "time_utc": now.strftime("%H:%M"),
    "commit": os.environ["COMMIT"], "cpu": os.environ["CPU"], "cores": os.cpu_count(),
    "workload": f"{os.environ['WORKLOAD'] or os.path.basename(sys.argv[2])}: trace of {os.path.getsize(sys.argv[2])} bytes, {os.environ['EVENTS']} events (bench/analyses.sh)",
    "tool": "trapline analyses", "rounds": len(runs["stats"]),
    "median_s": {w: statistics.median(r[0] for r in v) for w, v in runs.items()},
    "seconds": {w: [r[0] for r in v] for w, v in runs.items()},
    "peak_rss_kb": {w: max(r[1] for r in v) for w, v in runs.items()},
}
row["indexed_to_first"] = {
    w: round(row["median_s"][w + "+idx"] / row["median_s"][w], 3) for w in ("locks", "deadlocks")
}
if "heaptrack_print" in row["median_s"]:
    anchor = row["median_s"]["heaptrack_print"]
    row["ratio_to_heaptrack_print"] = {w: round(v / anchor, 2) for w, v in row["median_s"].items()}
with open(sys.argv[3], "a") as out:
    out.write(json.dumps(row) + "\n")
print(json.dumps(row, indent=1))
PY
