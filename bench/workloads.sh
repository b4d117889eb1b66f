#!/usr/bin/env bash
# Real programs under each recorder: the sqlite3 shell on a heavy query,
# perl, python3.11, node, xz -T2, gcc's cc1 on sqlite3.c, gcc's cc1plus on
# a C++ file that includes the whole standard library, and a two-thread
# allocator stress
# (bench/src/threads_pairs.c), run natively, under `trapline run`
# (full: memory and locks), `trapline run --record mem`, `trapline run
# --record locks`, sampled (`trapline run --sample`, and with `--record
# mem`), production mode (`trapline run --production`), jemalloc
# preloaded (`jemalloc`) and with its sampled heap profiler
# (`jemalloc-prof`: prof:true,lg_prof_sample:19, one sample per 512 KiB as
# trapline's), and `heaptrack -r` (recording only, as trapline does),
# interleaved round by round. The figure is the wall time of the whole
# command (start, run, and the tool's exit work: trapline's exit scan and
# trace, heaptrack's raw file). Prints the medians and appends one row per
# workload and tool to bench/results.jsonl.
#
#   bench/workloads.sh           (release build of this tree)
#
# Knobs (environment): ROUNDS=3,
# WORKLOADS="sqlite3 perl python node xz cc1 cc1plus stress",
# TOOLS="native trapline mem locks sampled sampled-mem production jemalloc
# jemalloc-prof heaptrack",
# SQLITE_C (cc1's input; default: the registry's sqlite3.c).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/workloads
ROUNDS=${ROUNDS:-3}
WORKLOADS=${WORKLOADS:-"sqlite3 perl python node xz cc1 cc1plus stress"}
TOOLS=${TOOLS:-"native trapline mem locks sampled sampled-mem production jemalloc jemalloc-prof heaptrack"}
JEMALLOC=${JEMALLOC:-$(ldconfig -p | sed -n 's/.*libjemalloc\.so\.2 .*=> //p' | sed -n 1p)}
if [[ " $TOOLS " == *" jemalloc"* && ! -f $JEMALLOC ]]; then
    echo "bench/workloads.sh: no libjemalloc.so.2 (apt-get install libjemalloc2, or set JEMALLOC)" >&2
    exit 1
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

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-agent >&2)
TRAPLINE=$ROOT/target/release/trapline

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

# seconds TOOL NAME: runs workload NAME under TOOL; prints its wall seconds.
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
    esac
    local -a pre
    case $tool in
        native) pre=() ;;
        trapline) pre=("$TRAPLINE" run -q --force -o "$WORK/t.trace" --) ;;
        mem) pre=("$TRAPLINE" run -q --force --record mem -o "$WORK/m.trace" --) ;;
        locks) pre=("$TRAPLINE" run -q --force --record locks -o "$WORK/l.trace" --) ;;
        sampled) pre=("$TRAPLINE" run -q --force --sample -o "$WORK/s.trace" --) ;;
        sampled-mem) pre=("$TRAPLINE" run -q --force --sample --record mem -o "$WORK/sm.trace" --) ;;
        production) pre=("$TRAPLINE" run -q --force --production -o "$WORK/p.trace" --) ;;
        jemalloc) pre=(env LD_PRELOAD="$JEMALLOC") ;;
        jemalloc-prof)
            rm -f "$WORK"/jeprof.*
            pre=(env LD_PRELOAD="$JEMALLOC" MALLOC_CONF="prof:true,lg_prof_sample:19,prof_prefix:$WORK/jeprof")
            ;;
        heaptrack) rm -f "$WORK"/h.*; pre=(heaptrack -r -o "$WORK/h") ;;
    esac
    start=$(date +%s.%N)
    "${pre[@]}" "${cmd[@]}" >/dev/null 2>"$WORK/stderr" || {
        echo "$tool $name failed:" >&2
        tail -5 "$WORK/stderr" >&2
        return 1
    }
    end=$(date +%s.%N)
    python3 -c "print(round($end - $start, 3))"
}

results=$WORK/results.txt
: >"$results"
for _ in $(seq "$ROUNDS"); do
    for name in $WORKLOADS; do
        for tool in $TOOLS; do
            echo "$name $tool $(seconds "$tool" "$name")" | tee -a "$results" >&2
        done
    done
done

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
HEAPTRACK=$(heaptrack --version 2>/dev/null | sed -n 1p)
CPU=$CPU COMMIT=$COMMIT HEAPTRACK=$HEAPTRACK python3 - "$results" "$ROOT/bench/results.jsonl" <<'PY'
import datetime, json, os, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, tool, value = line.split()
    runs.setdefault(name, {}).setdefault(tool, []).append(float(value))
describe = {
    "sqlite3": "sqlite3 shell: 400,000 rows of up to 200 bytes inserted, indexed and grouped",
    "perl": "perl: a hash of 1,500,000 strings",
    "python": "python3.11: a dict of 1,500,000 strings",
    "node": "node: a Map of 1,500,000 strings",
    "xz": "xz -T2 -6 of 48 MiB of text",
    "cc1": "gcc 12 cc1 -O2 on sqlite3.c",
    "cc1plus": "gcc 12 cc1plus -O2 on bits/stdc++.h and container code",
    "stress": "threads_pairs: 20 M malloc+free pairs in 2 threads",
}
names = {"native": "native", "trapline": "trapline", "mem": "trapline --record mem",
         "locks": "trapline --record locks", "sampled": "trapline --sample",
         "sampled-mem": "trapline --sample --record mem", "production": "trapline --production",
         "jemalloc": "jemalloc (preloaded)", "jemalloc-prof": "jemalloc prof:true,lg_prof_sample:19",
         "heaptrack": os.environ["HEAPTRACK"] + " -r"}
now = datetime.datetime.now(datetime.timezone.utc)
with open(sys.argv[2], "a") as out:
    for name, tools in runs.items():
        native = statistics.median(tools["native"])
        for tool, values in tools.items():
            median = statistics.median(values)
            row = {
                "date": now.strftime("%Y-%m-%d"), "time_utc": now.strftime("%H:%M"),
                "commit": os.environ["COMMIT"], "cpu": os.environ["CPU"],
                "workload": f"workloads: {describe[name]}, wall time (bench/workloads.sh)",
                "tool": names[tool], "rounds": len(values),
                "median_s": round(median, 3), "ratio_to_native": round(median / native, 3),
                "values": values,
                "spread_s": round(max(values) - min(values), 3),
            }
            if tool == "jemalloc-prof" and "jemalloc" in tools:
                row["ratio_to_jemalloc"] = round(median / statistics.median(tools["jemalloc"]), 3)
            out.write(json.dumps(row) + "\n")
            print(f"{name:8} {names[tool]:28} {median:8.3f} s {median / native:6.2f}x")
PY
