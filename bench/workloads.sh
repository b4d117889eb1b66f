#!/usr/bin/env bash
# Real programs under each recorder: the sqlite3 shell on a heavy query,
# perl, python3.11, node, xz -T2, gcc's cc1 on sqlite3.c, gcc's cc1plus on
# a C++ file that includes the whole standard library, a two-thread
# allocator stress (bench/src/threads_pairs.c), and two servers on
# loopback: redis-server driven by redis-benchmark and nginx (a master and
# two workers, a 4 KiB static file) driven by wrk, the clients never under
# a tool. Run natively, under `trapline run` (full: memory and locks),
# `trapline run --record mem`, `trapline run --record locks`, sampled
# (`trapline run --sample`, and with `--record mem`), production mode
# (`trapline run --production`), jemalloc preloaded (`jemalloc`) and with
# its sampled heap profiler (`jemalloc-prof`: prof:true,lg_prof_sample:19,
# one sample per 512 KiB as trapline's), and `heaptrack -r` (recording
# only, as trapline does), interleaved round by round. The figure is the
# wall time of the whole command (start, run, and the tool's exit work:
# trapline's exit scan and trace, heaptrack's raw file); for the servers,
# the requests per second the client measured. Every run also gives the
# peak RSS of the measured program (bench/src/maxrss.c's wait4). Prints the
# medians and appends one row per workload and tool to RESULTS. A cell a
# tool cannot run is skipped with a message.
#
#   bench/workloads.sh           (release build of this tree)
#
# Knobs (environment): ROUNDS=3,
# WORKLOADS="sqlite3 perl python node xz cc1 cc1plus stress redis nginx",
# TOOLS="native trapline mem locks sampled sampled-mem production jemalloc
# jemalloc-prof heaptrack", RESULTS=bench/results.jsonl (where rows go),
# REDIS_N=100000 (requests per redis-benchmark test, and its keys),
# NGINX_SECS=4 (wrk's duration), READY_TIMEOUT=120 (seconds a server may
# take to answer, or to end once stopped), NO_INSTALL=1 (do not apt-get
# install a missing wrk), TRAPLINE (the CLI, the agent beside it; default:
# the release build), NO_BUILD=1 (do not build it), SQLITE_C (cc1's input;
# default: the registry's sqlite3.c).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/workloads
ROUNDS=${ROUNDS:-3}
WORKLOADS=${WORKLOADS:-"sqlite3 perl python node xz cc1 cc1plus stress redis nginx"}
TOOLS=${TOOLS:-"native trapline mem locks sampled sampled-mem production jemalloc jemalloc-prof heaptrack"}
JEMALLOC=${JEMALLOC:-$(ldconfig -p | sed -n 's/.*libjemalloc\.so\.2 .*=> //p' | sed -n 1p)}
RESULTS=${RESULTS:-$ROOT/bench/results.jsonl}
REDIS_N=${REDIS_N:-100000}
NGINX_SECS=${NGINX_SECS:-4}
READY_TIMEOUT=${READY_TIMEOUT:-120}
if [[ " $TOOLS " == *" jemalloc"* && ! -f $JEMALLOC ]]; then
    echo "bench/workloads.sh: no libjemalloc.so.2 (apt-get install libjemalloc2, or set JEMALLOC): skipping the jemalloc tools" >&2
fi
if [[ " $TOOLS " == *" heaptrack "* ]] && ! command -v heaptrack >/dev/null; then
    echo "bench/workloads.sh: no heaptrack: skipping it" >&2
fi
if [[ " $WORKLOADS " == *" nginx "* ]] && ! command -v wrk >/dev/null; then
    if [[ -z ${NO_INSTALL:-} && $(id -u) == 0 ]]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk >&2 || true
    fi
    command -v wrk >/dev/null || echo "bench/workloads.sh: no wrk (apt-get install wrk): skipping nginx" >&2
fi
# shellcheck source=bench/sqlite.sh
source "$BENCH_DIR/sqlite.sh"
SQLITE_C=${SQLITE_C:-$(registry_sqlite_c || true)}
if [[ " $WORKLOADS " == *" cc1 "* && ! -f $SQLITE_C ]]; then
    echo "bench/workloads.sh: no sqlite3.c for cc1 (set SQLITE_C)" >&2
    exit 1
fi
CC1=$(gcc -print-prog-name=cc1)
MULTIARCH=$(gcc -print-multiarch)
mkdir -p "$WORK"
# The servers' files: nginx's workers run as nobody.
mkdir -p "$WORK/srv"
chmod 1777 "$WORK/srv"

if [[ -z ${NO_BUILD:-} ]]; then
    (cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-agent >&2)
fi
TRAPLINE=${TRAPLINE:-$ROOT/target/release/trapline}
# Measure copies, so a build elsewhere during the run cannot swap them (the
# CLI finds the agent beside itself).
mkdir -p "$WORK/measured"
cp -p "$TRAPLINE" "$WORK/measured/trapline"
cp -p "$(dirname "$TRAPLINE")/libtrapline_agent.so" "$WORK/measured/libtrapline_agent.so"
TRAPLINE=$WORK/measured/trapline

# The input of xz: 48 MiB of text that compresses about 4:1.
if [[ ! -s $WORK/xz-input ]]; then
    python3 -c '
import random, sys
random.seed(7)
words = [("".join(random.choice("etaoinshrdlu") for _ in range(random.randint(2, 9)))) for _ in range(5000)]
out = sys.stdout
n = 0
while n < 48 << 20:
    line = " ".join(random.choice(words) for _ in range(12)) + "\n"
    out.write(line)
    n += len(line)
' >"$WORK/xz-input"
fi

# cc1plus's input: every standard header, preprocessed once, and code that
# instantiates containers and algorithms over several types.
CC1PLUS=$(g++ -print-prog-name=cc1plus)
n=0
if [[ ! -s $WORK/std.ii ]]; then
    {
        echo '#include <bits/stdc++.h>'
        for t in int long double std::string 'std::vector<int>' 'std::pair<int, std::string>'; do
            n=$((n + 1))
            cat <<CXX
namespace w$n {
using T = $t;
std::map<T, std::vector<T>> index_of(const std::vector<T> &v) {
    std::map<T, std::vector<T>> m;
    for (const auto &x : v) m[x].push_back(x);
    return m;
}
std::set<T> sorted(std::vector<T> v) { std::sort(v.begin(), v.end()); return {v.begin(), v.end()}; }
std::unordered_map<std::size_t, std::list<T>> buckets(const std::vector<T> &v) {
    std::unordered_map<std::size_t, std::list<T>> b;
    for (std::size_t i = 0; i < v.size(); i++) b[i % 7].push_back(v[i]);
    return b;
}
}
CXX
        done
    } >"$WORK/std.cc"
    g++ -std=c++20 -E "$WORK/std.cc" -o "$WORK/std.ii"
fi
gcc -O2 -pthread -o "$WORK/threads_pairs" "$BENCH_DIR/src/threads_pairs.c"
gcc -O2 -o "$WORK/maxrss" "$BENCH_DIR/src/maxrss.c"
MAXRSS=$WORK/maxrss

SQLITE_SQL="CREATE TABLE t(a INTEGER, b TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 400000)
  INSERT INTO t SELECT x, printf('%.*c', x % 200, 'x') FROM c;
CREATE INDEX ti ON t(b);
SELECT count(*), sum(length(b)) FROM t GROUP BY a % 1000 ORDER BY 2 DESC LIMIT 1;"
PERL_SCRIPT='my %h; for my $i (1..1500000) { $h{$i} = "x" x ($i % 100); }
my $s = 0; $s += length($h{$_}) for keys %h; print "$s\n";'
PYTHON_SCRIPT='d = {i: str(i) * (i % 30) for i in range(1500000)}; print(sum(len(v) for v in d.values()))'
NODE_SCRIPT='const m = new Map(); for (let i = 0; i < 1500000; i++) m.set(i, "x".repeat(i % 100) + i);
let s = 0; for (const v of m.values()) s += v.length; console.log(s);'

# The interpreter itself, not a version manager's shim script (pyenv's is a
# shell script that execs several programs, each of which a recorder loads).
PYTHON=$(command -v /usr/bin/python3.11 || command -v python3.11)

# nginx's prefix: its configuration (PORT replaced at each start), a 4 KiB
# file to serve, and its temporary paths.
NGINX_DIR=$WORK/srv/nginx
mkdir -p "$NGINX_DIR/html" "$NGINX_DIR/logs" "$NGINX_DIR/tmp"
python3 -c 'import random; random.seed(7); print("".join(random.choice("abcdefghij\n") for _ in range(4095)))' \
    >"$NGINX_DIR/html/index.html"
cat >"$NGINX_DIR/nginx.conf.in" <<NGINX
pid $NGINX_DIR/nginx.pid;
error_log $NGINX_DIR/logs/error.log warn;
master_process on;
worker_processes 2;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path $NGINX_DIR/tmp/body;
    proxy_temp_path $NGINX_DIR/tmp/proxy;
    fastcgi_temp_path $NGINX_DIR/tmp/fastcgi;
    uwsgi_temp_path $NGINX_DIR/tmp/uwsgi;
    scgi_temp_path $NGINX_DIR/tmp/scgi;
    server {
        listen 127.0.0.1:PORT;
        root $NGINX_DIR/html;
    }
}
NGINX

# A free loopback port (free when asked; the server binds it soon after).
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# prefix TOOL NAME: sets PRE, the words before the measured command, with
# maxrss as the direct parent of the measured program (inside trapline, as
# the CLI's own memory is not the program's; outside heaptrack, whose
# preload would record maxrss and not follow into the program), and SKIP,
# why TOOL cannot run here (empty if it can).
prefix() {
    local tool=$1 name=$2 out=$WORK
    [[ $name == redis || $name == nginx ]] && out=$WORK/srv
    local rss=$WORK/maxrss.out
    SKIP=
    case $tool in
        native) PRE=("$MAXRSS" "$rss") ;;
        trapline) PRE=("$TRAPLINE" run -q --force -o "$out/t.trace" -- "$MAXRSS" "$rss") ;;
        mem) PRE=("$TRAPLINE" run -q --force --record mem -o "$out/m.trace" -- "$MAXRSS" "$rss") ;;
        locks) PRE=("$TRAPLINE" run -q --force --record locks -o "$out/l.trace" -- "$MAXRSS" "$rss") ;;
        sampled) PRE=("$TRAPLINE" run -q --force --sample -o "$out/s.trace" -- "$MAXRSS" "$rss") ;;
        sampled-mem) PRE=("$TRAPLINE" run -q --force --sample --record mem -o "$out/sm.trace" -- "$MAXRSS" "$rss") ;;
        production)
            # Not quiet: the servers' summaries are kept in $WORK/NAME-production.stderr.
            PRE=("$TRAPLINE" run --force --production -o "$out/p.trace" -- "$MAXRSS" "$rss")
            ;;
        jemalloc) PRE=("$MAXRSS" "$rss" env LD_PRELOAD="$JEMALLOC") ;;
        jemalloc-prof)
            rm -f "$out"/jeprof.*
            PRE=("$MAXRSS" "$rss" env LD_PRELOAD="$JEMALLOC" MALLOC_CONF="prof:true,lg_prof_sample:19,prof_prefix:$out/jeprof")
            ;;
        heaptrack) rm -f "$out"/h.*; PRE=("$MAXRSS" "$rss" heaptrack -r -o "$out/h") ;;
        *) SKIP="unknown tool" ;;
    esac
    if [[ $tool == jemalloc* && ! -f $JEMALLOC ]]; then SKIP="no libjemalloc.so.2"; fi
    if [[ $tool == heaptrack ]] && ! command -v heaptrack >/dev/null; then SKIP="no heaptrack"; fi
    rm -f "$rss"
    return 0
}

# The peak RSS maxrss wrote, in KiB.
peak_rss() {
    local v
    v=$(cat "$WORK/maxrss.out" 2>/dev/null || true)
    [[ $v =~ ^[0-9]+$ ]] && echo "$v" || echo null
}

# seconds TOOL NAME: runs workload NAME under TOOL; prints its wall seconds
# and peak RSS (KiB).
seconds() {
    local tool=$1 name=$2 start end
    local -a cmd
    case $name in
        sqlite3) cmd=(sqlite3 :memory: "$SQLITE_SQL") ;;
        perl) cmd=(perl -e "$PERL_SCRIPT") ;;
        python) cmd=("$PYTHON" -c "$PYTHON_SCRIPT") ;;
        node) cmd=(node -e "$NODE_SCRIPT") ;;
        xz) cmd=(xz -T2 -6 -c "$WORK/xz-input") ;;
        cc1) cmd=("$CC1" -quiet -imultiarch "$MULTIARCH" -O2 "$SQLITE_C" -o /dev/null) ;;
        cc1plus) cmd=("$CC1PLUS" -quiet -std=c++20 -O2 "$WORK/std.ii" -o /dev/null) ;;
        stress) cmd=("$WORK/threads_pairs" 20000000 2) ;;
        *) echo "unknown workload" >&2; return 1 ;;
    esac
    prefix "$tool" "$name"
    if [[ -n $SKIP ]]; then echo "$SKIP" >&2; return 1; fi
    start=$(date +%s.%N)
    "${PRE[@]}" "${cmd[@]}" >/dev/null 2>"$WORK/stderr" || {
        echo "failed: $(tail -5 "$WORK/stderr")" >&2
        return 1
    }
    end=$(date +%s.%N)
    echo "$(python3 -c "print(round($end - $start, 3))") $(peak_rss)"
}

# serve TOOL NAME: starts server NAME (redis, nginx) under TOOL on a free
# port, waits until it answers, loads it with its client (not under TOOL),
# stops it and waits for it (and TOOL's exit work) to end. Prints the
# requests per second, the peak RSS (KiB) and a JSON object of details.
serve() {
    local tool=$1 name=$2 port pid ready=0 deadline rc=0 load=$WORK/$name-$tool.load
    local -a cmd
    local log=$WORK/$name-$tool
    port=$(free_port)
    case $name in
        redis)
            command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null ||
                { echo "no redis-server or redis-benchmark" >&2; return 1; }
            cmd=(redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no
                --dir "$WORK/srv" --logfile '')
            ;;
        nginx)
            [[ -x /usr/sbin/nginx ]] || { echo "no /usr/sbin/nginx" >&2; return 1; }
            command -v wrk >/dev/null || { echo "no wrk" >&2; return 1; }
            sed "s/PORT/$port/" "$NGINX_DIR/nginx.conf.in" >"$NGINX_DIR/nginx.conf"
            rm -f "$NGINX_DIR/nginx.pid"
            cmd=(/usr/sbin/nginx -p "$NGINX_DIR" -c "$NGINX_DIR/nginx.conf" -e "$NGINX_DIR/logs/error.log"
                -g 'daemon off;')
            ;;
        *) echo "unknown workload" >&2; return 1 ;;
    esac
    prefix "$tool" "$name"
    if [[ -n $SKIP ]]; then echo "$SKIP" >&2; return 1; fi
    "${PRE[@]}" "${cmd[@]}" >"$log.stdout" 2>"$log.stderr" &
    pid=$!
    deadline=$((SECONDS + READY_TIMEOUT))
    while ((SECONDS < deadline)) && kill -0 "$pid" 2>/dev/null; do
        case $name in
            redis) [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] && ready=1 ;;
            nginx) [[ -s $NGINX_DIR/nginx.pid && $(curl -s -o /dev/null -w '%{http_code}' \
                "http://127.0.0.1:$port/index.html") == 200 ]] && ready=1 ;;
        esac
        ((ready)) && break
        sleep 0.05
    done
    if ((!ready)); then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        echo "did not answer on port $port within ${READY_TIMEOUT}s: $(tail -3 "$log.stderr")" >&2
        return 1
    fi
    case $name in
        redis)
            timeout $((READY_TIMEOUT + 600)) redis-benchmark -p "$port" -n "$REDIS_N" -r "$REDIS_N" -P 1 -c 8 \
                -t set,get,lpush,lpop --csv >"$load" 2>&1 || rc=$?
            redis-cli -p "$port" info stats 2>/dev/null | tr -d '\r' | sed -n 's/^total_commands_processed:/commands /p' >>"$load"
            redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
            ;;
        nginx)
            timeout $((NGINX_SECS + 60)) wrk -t1 -c8 -d"${NGINX_SECS}s" \
                "http://127.0.0.1:$port/index.html" >"$load" 2>&1 || rc=$?
            kill -QUIT "$(cat "$NGINX_DIR/nginx.pid")" 2>/dev/null || true
            ;;
    esac
    deadline=$((SECONDS + READY_TIMEOUT))
    while ((SECONDS < deadline)) && kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "still running ${READY_TIMEOUT}s after it was stopped: killed" >&2
        kill -KILL "$pid" 2>/dev/null || true
        if [[ $name == nginx && -s $NGINX_DIR/nginx.pid ]]; then
            local master
            master=$(cat "$NGINX_DIR/nginx.pid")
            # shellcheck disable=SC2046
            kill -KILL "$master" $(cat /proc/"$master"/task/*/children 2>/dev/null) 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
        return 1
    fi
    wait "$pid" || { echo "exit status $?: $(tail -3 "$log.stderr")" >&2; return 1; }
    ((rc == 0)) || { echo "the client failed ($rc): $(tail -3 "$load")" >&2; return 1; }
    python3 - "$name" "$load" "$(peak_rss)" "$REDIS_N" <<'PY' || return 1
import csv, json, re, sys
name, load, rss = sys.argv[1], open(sys.argv[2]).read(), sys.argv[3]
if name == "redis":
    # --csv: "test","rps",...; the figure is all requests over all tests' time.
    rps = {r[0]: float(r[1]) for r in csv.reader(load.splitlines()) if len(r) > 2 and r[0] != "test"}
    if len(rps) != 4:
        sys.exit(f"redis-benchmark gave {len(rps)} tests, not 4: {load[-300:]}")
    total = len(rps) / sum(1 / v for v in rps.values())
    # The server's own count: every request, and redis-cli's ping and info.
    m = re.search(r"^commands (\d+)$", load, re.M)
    if not m or int(m.group(1)) < 4 * int(sys.argv[4]):
        sys.exit(f"redis counted {m and m.group(1)} commands, not at least 4 x {sys.argv[4]}")
    details = {"requests_per_s_by_test": rps}
else:
    m = re.search(r"Requests/sec:\s*([0-9.]+)", load)
    if not m:
        sys.exit(f"no Requests/sec in wrk's output: {load[-300:]}")
    total = float(m.group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", load)
    err = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", load)
    n = re.search(r"(\d+) requests in", load)
    details = {"requests_total": int(n.group(1)) if n else 0, "not_2xx": int(bad.group(1)) if bad else 0,
               "socket_errors": sum(map(int, err.groups())) if err else 0}
    if details["not_2xx"]:
        sys.exit(f"{details['not_2xx']} answers were not 2xx")
print(f"{total:.0f} {rss} {json.dumps(details, separators=(',', ':'))}")
PY
}

results=$WORK/results.txt
: >"$results"
for _ in $(seq "$ROUNDS"); do
    for name in $WORKLOADS; do
        for tool in $TOOLS; do
            if [[ $name == redis || $name == nginx ]]; then runner=serve; else runner=seconds; fi
            if out=$("$runner" "$tool" "$name" 2>"$WORK/why"); then
                echo "$name $tool $out" | tee -a "$results" >&2
            else
                echo "$name $tool skipped: $(tr '\n' ' ' <"$WORK/why")" >&2
            fi
        done
    done
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
HEAPTRACK=$(heaptrack --version 2>/dev/null | sed -n 1p)
REDIS=$(redis-server --version 2>/dev/null | sed -n 's/.* v=\([^ ]*\).*/\1/p')
NGINX=$(/usr/sbin/nginx -v 2>&1 | sed -n 's|.*nginx/||p')
CPU=$CPU COMMIT=$COMMIT HEAPTRACK=${HEAPTRACK:-heaptrack} REDIS=$REDIS NGINX=$NGINX REDIS_N=$REDIS_N \
    NGINX_SECS=$NGINX_SECS python3 - "$results" "$RESULTS" <<'PY'
import datetime, json, os, statistics, sys
runs, rss, details = {}, {}, {}
for line in open(sys.argv[1]):
    name, tool, value, peak, *extra = line.split(maxsplit=4)
    runs.setdefault(name, {}).setdefault(tool, []).append(float(value))
    if peak != "null":
        rss.setdefault(name, {}).setdefault(tool, []).append(int(peak))
    if extra:
        details.setdefault(name, {}).setdefault(tool, []).append(json.loads(extra[0]))
servers = {"redis", "nginx"}
env = os.environ
describe = {
    "sqlite3": "sqlite3 shell: 400,000 rows of up to 200 bytes inserted, indexed and grouped",
    "perl": "perl: a hash of 1,500,000 strings",
    "python": "python3.11: a dict of 1,500,000 strings",
    "node": "node: a Map of 1,500,000 strings",
    "xz": "xz -T2 -6 of 48 MiB of text",
    "cc1": "gcc 12 cc1 -O2 on sqlite3.c",
    "cc1plus": "gcc 12 cc1plus -O2 on bits/stdc++.h and container code",
    "stress": "threads_pairs: 20 M malloc+free pairs in 2 threads",
    "redis": f"redis-server {env['REDIS']}: redis-benchmark -c 8 -P 1, {int(env['REDIS_N']):,} requests "
             f"each of set, get, lpush, lpop, keys drawn from {int(env['REDIS_N']):,}, on loopback, requests per second",
    "nginx": f"nginx {env['NGINX']}: master and 2 workers, a 4 KiB static file, wrk -t1 -c8 (keep-alive) "
             f"for {env['NGINX_SECS']} s, on loopback, requests per second",
}
names = {"native": "native", "trapline": "trapline", "mem": "trapline --record mem",
         "locks": "trapline --record locks", "sampled": "trapline --sample",
         "sampled-mem": "trapline --sample --record mem", "production": "trapline --production",
         "jemalloc": "jemalloc (preloaded)", "jemalloc-prof": "jemalloc prof:true,lg_prof_sample:19",
         "heaptrack": env["HEAPTRACK"] + " -r"}
now = datetime.datetime.now(datetime.timezone.utc)
with open(sys.argv[2], "a") as out:
    for name, tools in runs.items():
        server = name in servers
        native = statistics.median(tools["native"]) if "native" in tools else None
        native_rss = statistics.median(rss[name]["native"]) if "native" in rss.get(name, {}) else None
        for tool, values in tools.items():
            median = statistics.median(values)
            kind = "requests per second" if server else "wall time"
            row = {
                "date": now.strftime("%Y-%m-%d"), "time_utc": now.strftime("%H:%M"),
                "commit": env["COMMIT"], "cpu": env["CPU"],
                "workload": f"workloads: {describe[name]}" + ("" if server else f", {kind}") + " (bench/workloads.sh)",
                "tool": names[tool], "rounds": len(values),
            }
            if server:
                row["requests_per_s_median"] = round(median)
                if native:
                    # Higher is better: the tool's rate over the native rate.
                    row["throughput_ratio"] = round(median / native, 3)
                row["values"] = [round(v) for v in values]
                for d in details.get(name, {}).get(tool, []):
                    for k, v in d.items():
                        if k == "requests_per_s_by_test":
                            for test, r in v.items():
                                row.setdefault("requests_per_s_by_test", {}).setdefault(test, []).append(r)
                        elif isinstance(v, int):
                            row[k] = row.get(k, 0) + v
                if "requests_per_s_by_test" in row:
                    row["requests_per_s_by_test"] = {t: round(statistics.median(v))
                                                     for t, v in row["requests_per_s_by_test"].items()}
            else:
                row["median_s"] = round(median, 3)
                if native:
                    row["ratio_to_native"] = round(median / native, 3)
                row["values"] = values
                row["spread_s"] = round(max(values) - min(values), 3)
            peaks = rss.get(name, {}).get(tool)
            if peaks:
                row["maxrss_kib"] = round(statistics.median(peaks))
                row["maxrss_kib_values"] = peaks
                if native_rss is not None and tool != "native":
                    row["added_rss_kib"] = round(statistics.median(peaks) - native_rss)
                    if tool == "production":
                        # Issue 41's budget: at most 2% of the program's peak plus 16 MiB.
                        row["rss_budget_kib"] = round(0.02 * native_rss + 16384)
                        row["rss_budget_ok"] = row["added_rss_kib"] <= row["rss_budget_kib"]
            if tool == "jemalloc-prof" and "jemalloc" in tools:
                key = "throughput_ratio_to_jemalloc" if server else "ratio_to_jemalloc"
                row[key] = round(median / statistics.median(tools["jemalloc"]), 3)
            out.write(json.dumps(row) + "\n")
            figure = (f"{median:9.0f} req/s" + (f" {median / native:6.3f}x thr" if native else "")
                      if server else f"{median:8.3f} s" + (f" {median / native:6.2f}x" if native else ""))
            rss_text = f" {row['maxrss_kib']:8d} KiB peak" if "maxrss_kib" in row else ""
            if "added_rss_kib" in row:
                rss_text += f" ({row['added_rss_kib']:+d} KiB"
                if "rss_budget_ok" in row:
                    rss_text += f", budget {row['rss_budget_kib']} KiB: {'ok' if row['rss_budget_ok'] else 'OVER'}"
                rss_text += ")"
            print(f"{name:8} {names[tool]:36} {figure}{rss_text}")
PY
