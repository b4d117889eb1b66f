#!/usr/bin/env bash
# What `trapline export --format perfetto` makes of a real service's
# trace: memcached (-t 4) recorded under 8 local clients doing set+get in
# a loop, then exported ROUNDS times. Measures the trace's and the file's
# size, the export's seconds and peak RSS, and the seconds Chrome
# DevTools' own trace engine (tests/consumers) takes to read the file.
# Appends one row to bench/results.jsonl.
#
#   bench/perfetto.sh        (release build of this tree; needs memcached,
#                             node and `npm ci --prefix tests/consumers`)
#
# Knobs (environment): ROUNDS=3, OPS=60000 (set+get pairs per client).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/perfetto
ROUNDS=${ROUNDS:-3}
OPS=${OPS:-60000}
PORT=${PORT:-11997}
mkdir -p "$WORK"

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-agent >&2)
TRAPLINE=$ROOT/target/release/trapline
TRACE=$WORK/memcached.trace
rm -f "$TRACE"*

"$TRAPLINE" run -q -o "$TRACE" -- memcached -u root -l 127.0.0.1 -p "$PORT" -t 4 &
recorder=$!
OPS=$OPS PORT=$PORT python3 - <<'PY'
import os, socket, threading, time
port, ops = int(os.environ["PORT"]), int(os.environ["OPS"])
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", port)).close()
        break
    except OSError:
        time.sleep(0.05)
def client(n):
    f = socket.create_connection(("127.0.0.1", port)).makefile("rwb")
    for i in range(ops):
        k = f"k{n}_{i % 500}"
        f.write(f"set {k} 0 0 5\r\nhello\r\nget {k}\r\n".encode())
        f.flush()
        answers = [f.readline() for _ in range(4)]
        assert answers[0] == b"STORED\r\n", answers
threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
for t in threads: t.start()
for t in threads: t.join()
PY
pkill -TERM -x -f "memcached -u root -l 127.0.0.1 -p $PORT -t 4" || pkill -TERM -x memcached
wait "$recorder" || true

results=$WORK/results.txt
: >"$results"
for _ in $(seq "$ROUNDS"); do
    /usr/bin/time -f "export %e %M" -a -o "$results" \
        "$TRAPLINE" export "$TRACE" --format perfetto --force -o "$WORK/timeline.json"
    /usr/bin/time -f "devtools %e %M" -a -o "$results" \
        node "$ROOT/tests/consumers/devtools_threads.mjs" "$WORK/timeline.json" >/dev/null
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
CPU=$CPU COMMIT=$COMMIT OPS=$OPS python3 - "$results" "$TRACE" "$WORK/timeline.json" "$ROOT/bench/results.jsonl" <<'PY'
import datetime, json, os, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    what, secs, kb = line.split()
    runs.setdefault(what, []).append((float(secs), int(kb)))
summary = json.load(open(sys.argv[3]))["otherData"]["trapline"]
now = datetime.datetime.now(datetime.timezone.utc)
med = lambda what, i: statistics.median(r[i] for r in runs[what])
row = {
    "date": now.strftime("%Y-%m-%d"), "time_utc": now.strftime("%H:%M"),
    "commit": os.environ["COMMIT"], "cpu": os.environ["CPU"],
    "workload": f"memcached -t 4, 8 local clients x {os.environ['OPS']} set+get (bench/perfetto.sh)",
    "tool": "trapline export --format perfetto", "rounds": len(runs["export"]),
    "trace_bytes": os.path.getsize(sys.argv[2]), "json_bytes": os.path.getsize(sys.argv[3]),
    "export_seconds": [r[0] for r in runs["export"]], "export_median_s": med("export", 0),
    "export_peak_rss_kb": max(r[1] for r in runs["export"]),
    "devtools_read_seconds": [r[0] for r in runs["devtools"]], "devtools_read_median_s": med("devtools", 0),
    "spans": {k: summary[k] for k in ("waits", "holds", "merged_hold_spans")},
    "left_out": summary["left_out"],
}
row["json_to_trace"] = round(row["json_bytes"] / row["trace_bytes"], 3)
with open(sys.argv[4], "a") as out:
    out.write(json.dumps(row) + "\n")
print(json.dumps(row, indent=1))
PY
