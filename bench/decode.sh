#!/usr/bin/env bash
# Decode throughput per core: every chunk of TRACE read, checked,
# decompressed and decoded into events with 1..N threads
# (crates/analysis/examples/decode_rate.rs), beside a full `trapline
# stats` pass of the same trace (decoding on every core, the merge and
# the analysis on one). Appends one row to bench/results.jsonl.
#
#   bench/decode.sh [TRACE]   (default: bench/perfetto.sh's memcached trace)
#
# Knobs (environment): ROUNDS=3.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
ROUNDS=${ROUNDS:-3}
TRACE=${1:-$BENCH_DIR/work/perfetto/memcached.trace}
WORK=$BENCH_DIR/work/decode
mkdir -p "$WORK"
[ -f "$TRACE" ] || { echo "no trace at $TRACE: run bench/perfetto.sh first, or name one" >&2; exit 2; }

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-analysis --example decode_rate >&2)
TRAPLINE=$ROOT/target/release/trapline
"$ROOT/target/release/examples/decode_rate" "$TRACE" "$ROUNDS" >"$WORK/rates.jsonl"
: >"$WORK/stats.txt"
for _ in $(seq "$ROUNDS"); do
    /usr/bin/time -f "%e %M" -a -o "$WORK/stats.txt" "$TRAPLINE" stats "$TRACE" >/dev/null
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
CPU=$CPU COMMIT=$COMMIT python3 - "$WORK/rates.jsonl" "$WORK/stats.txt" "$TRACE" "$ROOT/bench/results.jsonl" <<'PY'
import datetime, json, os, statistics, sys
rates = [json.loads(l) for l in open(sys.argv[1])]
stats = [tuple(map(float, l.split())) for l in open(sys.argv[2])]
events = rates[0]["events"]
by_threads = {}
for r in rates:
    by_threads.setdefault(r["threads"], []).append(r["events_per_s"])
med = {t: round(statistics.median(v)) for t, v in sorted(by_threads.items())}
stats_s = statistics.median(s for s, _ in stats)
now = datetime.datetime.now(datetime.timezone.utc)
row = {
    "date": now.strftime("%Y-%m-%d"), "time_utc": now.strftime("%H:%M"),
    "commit": os.environ["COMMIT"], "cpu": os.environ["CPU"], "cores": os.cpu_count(),
    "workload": f"decode every chunk of {os.path.basename(sys.argv[3])} ({os.path.getsize(sys.argv[3])} bytes, {events} events) (bench/decode.sh)",
    "tool": "trapline-analysis decode_rate; trapline stats", "rounds": len(stats),
    "decode_events_per_s_median": med,
    "decode_events_per_s_per_core": round(med[max(med)] / max(med)),
    "stats_seconds": [s for s, _ in stats], "stats_median_s": stats_s,
    "stats_events_per_s": round(events / stats_s),
    "stats_peak_rss_kb": int(max(k for _, k in stats)),
}
with open(sys.argv[4], "a") as out:
    out.write(json.dumps(row) + "\n")
print(json.dumps(row, indent=1))
PY
