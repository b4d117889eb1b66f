#!/usr/bin/env bash
# Attaching to a running Python web server: `python3.11 -m http.server`
# answers a loop of local requests (bench/src/http_load.py, one at a time)
# for SECS seconds in each phase, interleaved ROUNDS times:
#   native      the server alone;
#   run         the server under `trapline run`;
#   before/attached/after   one server alone, then `trapline attach` for
#               SECS seconds, then `trapline detach`, then alone again.
# Every request of every phase must be answered 200. Appends one row to
# bench/results.jsonl with the requests per second of each phase (medians)
# and the attached phase's ratio to `run` and to native.
#
#   bench/attach_http.sh        (release build of this tree)
#
# Knobs (environment): ROUNDS=3, SECS=10, PORT=18181.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/attach_http
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-10}
PORT=${PORT:-18181}
PYTHON=/usr/bin/python3.11
mkdir -p "$WORK/www"
echo "hello" >"$WORK/www/index.html"

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-agent >&2)
TRAPLINE=$ROOT/target/release/trapline
export TRAPLINE_AGENT=$ROOT/target/release/libtrapline_agent.so

wait_up() {
    for _ in $(seq 200); do
        "$PYTHON" -c "import socket,sys; socket.create_connection(('127.0.0.1', $PORT), 0.1)" 2>/dev/null && return
        sleep 0.05
    done
    echo "the server did not start" >&2
    exit 1
}
load() { "$PYTHON" "$BENCH_DIR/src/http_load.py" "$PORT" "$SECS"; }
serve() { cd "$WORK/www" && exec "$@" -m http.server "$PORT" --bind 127.0.0.1; }

results=$WORK/results.jsonl
: >"$results"
for round in $(seq "$ROUNDS"); do
    (serve "$PYTHON" >/dev/null 2>&1) &
    server=$!
    wait_up
    echo "{\"round\": $round, \"phase\": \"native\", \"load\": $(load)}" >>"$results"
    kill "$server"; wait "$server" 2>/dev/null || true

    rm -f "$WORK"/run.trace*
    (serve "$TRAPLINE" run -q --force -o "$WORK/run.trace" -- "$PYTHON" >/dev/null 2>&1) &
    server=$!
    wait_up
    echo "{\"round\": $round, \"phase\": \"run\", \"load\": $(load)}" >>"$results"
    pkill -TERM -f "http.server $PORT" || true
    wait "$server" 2>/dev/null || true

    (serve "$PYTHON" >/dev/null 2>&1) &
    server=$!
    wait_up
    echo "{\"round\": $round, \"phase\": \"before\", \"load\": $(load)}" >>"$results"
    rm -f "$WORK/attach.trace"
    "$TRAPLINE" attach "$server" -o "$WORK/attach.trace" 2>>"$WORK/attach.log"
    echo "{\"round\": $round, \"phase\": \"attached\", \"load\": $(load)}" >>"$results"
    "$TRAPLINE" detach "$server" 2>>"$WORK/attach.log"
    echo "{\"round\": $round, \"phase\": \"after\", \"load\": $(load)}" >>"$results"
    kill "$server"; wait "$server" 2>/dev/null || true
    echo "round $round done" >&2
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
CPU=$CPU COMMIT=$COMMIT SECS=$SECS python3 - "$results" "$ROOT/bench/results.jsonl" <<'PY'
import datetime, json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
secs = float(os.environ["SECS"])
rate, bad = {}, 0
for r in rows:
    load = r["load"]
    ok = load["statuses"].get("200", 0)
    bad += load["failures"] + sum(n for s, n in load["statuses"].items() if s != "200")
    rate.setdefault(r["phase"], []).append(ok / secs)
med = {p: round(statistics.median(v), 1) for p, v in rate.items()}
now = datetime.datetime.now(datetime.timezone.utc)
row = {
    "date": now.strftime("%Y-%m-%d"), "time_utc": now.strftime("%H:%M"),
    "commit": os.environ["COMMIT"], "cpu": os.environ["CPU"],
    "workload": f"python3.11 -m http.server, GET / in a loop, {secs:g} s per phase (bench/attach_http.sh)",
    "tool": "trapline attach / detach", "rounds": len(rate.get("native", [])),
    "requests_per_s_median": med, "requests_per_s": {p: [round(x, 1) for x in v] for p, v in rate.items()},
    "not_200": bad,
    "attached_ratio_to_run": round(med["attached"] / med["run"], 3),
    "attached_ratio_to_native": round(med["attached"] / med["native"], 3),
}
with open(sys.argv[2], "a") as out:
    out.write(json.dumps(row) + "\n")
print(json.dumps(row, indent=1))
PY
