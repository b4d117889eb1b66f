#!/usr/bin/env bash
# The CPU profiler side by side with perf (see bench/README.md, "profile").
#
#   bench/profile.sh [overhead|compare|all]     (default: all)
#
# overhead: wall and CPU time of a CPU-bound program (bench/src/cpu_bound.c, no
#   allocation) and of a real, allocation-heavy one (SQLite, bench/src/sqlite_cpu.c)
#   run natively, under `perf record -e cpu-clock -F 999`, under `trapline run`
#   and under `trapline run --profile` (default 999 Hz); runs interleaved, medians.
# compare: the top 10 functions by self time of the SQLite workload under
#   `perf record -e cpu-clock -F 999` and `trapline run --profile`, each averaged
#   over COMPARE_REPS runs (trapline with --no-inline: symbol-level, like perf).
#
# Knobs (environment):
#   PROFILE_REPS=7      repetitions per tool (overhead)
#   COMPARE_REPS=3      repetitions per tool (compare)
#   CPU_ROUNDS=60       rounds of cpu_bound (~2 s native)
#   SQLITE_N=1500000    rows of the SQLite workload (~2.5 s native)
#   SQLITE_C=FILE       the SQLite amalgamation (default: libsqlite3-sys 0.30.1's,
#                       from the cargo registry; bench/run.sh fetches it)
#   TRAPLINE=PATH       the trapline CLI (default target/release/trapline)
#   NO_BUILD=1          skip `cargo build --release`
#
# Benchmarks are measurements, not tests: nothing here asserts on timings.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/sqlite.sh
. "$BENCH_DIR/sqlite.sh"
WORK=$BENCH_DIR/work/profile
PROFILE_REPS=${PROFILE_REPS:-7}
COMPARE_REPS=${COMPARE_REPS:-3}
CPU_ROUNDS=${CPU_ROUNDS:-60}
SQLITE_N=${SQLITE_N:-1500000}
TRAPLINE=${TRAPLINE:-$ROOT/target/release/trapline}
WHAT=${1:-all}

log() { printf '[bench profile] %s\n' "$*" >&2; }

median() {
    printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {
        if (NR == 0) { print "n/a"; exit }
        if (NR % 2) print a[(NR+1)/2]; else printf "%.6f\n", (a[NR/2] + a[NR/2+1]) / 2 }'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }'; }

setup() {
    command -v perf >/dev/null || { log "perf missing: apt-get install linux-perf"; exit 1; }
    command -v jq >/dev/null || { log "jq missing: apt-get install jq"; exit 1; }
    mkdir -p "$WORK"
    if [[ -z ${NO_BUILD:-} ]]; then
        (cd "$ROOT" && cargo build --release -q >&2)
    fi
    if [[ -z ${SQLITE_C:-} ]]; then
        SQLITE_C=$(registry_sqlite_c)
    fi
    [[ -f ${SQLITE_C:-} ]] || { log "no sqlite3.c (set SQLITE_C, or run bench/run.sh profile)"; exit 1; }
    gcc -O2 -g -o "$WORK/cpu_bound" "$BENCH_DIR/src/cpu_bound.c"
    if [[ ! -x $WORK/sqlite_cpu || $WORK/sqlite_cpu -ot $BENCH_DIR/src/sqlite_cpu.c ]]; then
        log "compiling SQLite (about a minute)"
        gcc -O2 -g -I"$(dirname "$SQLITE_C")" -o "$WORK/sqlite_cpu" \
            "$BENCH_DIR/src/sqlite_cpu.c" "$SQLITE_C" -lm
    fi
}

# run_once TOOL PROGRAM ARGS...: prints "wall_s cpu_s thread_cpu_s" (cpu: user
# + system of everything the run started, the tool included; thread_cpu: the
# program's main thread alone, as it reports itself, signal handlers included).
run_once() {
    local tool=$1 t0 t1
    shift
    local cmd=("$@")
    case $tool in
        native) ;;
        perf) cmd=(perf record -q -e cpu-clock -F 999 -o "$WORK/perf.data" -- "$@") ;;
        trapline) cmd=("$TRAPLINE" run -q -o "$WORK/t.trace" -- "$@") ;;
        trapline-profile) cmd=("$TRAPLINE" run -q --profile -o "$WORK/t.trace" -- "$@") ;;
    esac
    t0=$EPOCHREALTIME
    /usr/bin/time -f '%U %S' -o "$WORK/time.txt" "${cmd[@]}" >/dev/null 2>"$WORK/stderr.txt"
    t1=$EPOCHREALTIME
    local thread_cpu
    thread_cpu=$(sed -n 's/^thread_cpu_s //p' "$WORK/stderr.txt" | tail -1)
    awk -v t0="$t0" -v t1="$t1" -v tc="${thread_cpu:-0}" '{ printf "%.4f %.4f %s\n", t1 - t0, $1 + $2, tc }' "$WORK/time.txt"
}

TOOLS=(native perf trapline trapline-profile)

overhead() {
    local name=$1
    shift
    declare -A walls cpus threads
    local rep tool w c t
    for ((rep = 0; rep < PROFILE_REPS; rep++)); do
        for tool in "${TOOLS[@]}"; do
            read -r w c t <<<"$(run_once "$tool" "$@")"
            walls[$tool]+="$w "
            cpus[$tool]+="$c "
            threads[$tool]+="$t "
        done
    done
    local nat_wall nat_cpu nat_thread
    nat_wall=$(median ${walls[native]})
    nat_cpu=$(median ${cpus[native]})
    nat_thread=$(median ${threads[native]})
    echo
    echo "### $name ($PROFILE_REPS interleaved runs per tool, medians)"
    echo
    echo "| tool | wall s | wall / native | CPU s (all) | CPU / native | main thread CPU s | thread CPU / native |"
    echo "|---|---|---|---|---|---|---|"
    for tool in "${TOOLS[@]}"; do
        w=$(median ${walls[$tool]})
        c=$(median ${cpus[$tool]})
        t=$(median ${threads[$tool]})
        echo "| $tool | $w | $(ratio "$w" "$nat_wall") | $c | $(ratio "$c" "$nat_cpu") | $t | $(ratio "$t" "$nat_thread") |"
    done
    echo
    echo "Sampling's own cost (trapline --profile vs trapline): wall ratio $(ratio "$(median ${walls[trapline-profile]})" "$(median ${walls[trapline]})"), main-thread CPU ratio $(ratio "$(median ${threads[trapline-profile]})" "$(median ${threads[trapline]})")."
}

# Self percentages per function, averaged over runs: "PERCENT FUNCTION" lines, top 10.
average_top10() {
    awk -v runs="$1" '{ p = $1; sub(/%$/, "", p); $1 = ""; sub(/^ /, ""); s[$0] += p }
        END { for (f in s) printf "%.2f %s\n", s[f] / runs, f }' | sort -g -r | head -10
}

compare() {
    local rep perf_all="" tl_all=""
    for ((rep = 0; rep < COMPARE_REPS; rep++)); do
        perf record -q -e cpu-clock -F 999 -o "$WORK/cmp.data" -- "$WORK/sqlite_cpu" "$SQLITE_N" >/dev/null 2>&1
        perf_all+=$(perf report -i "$WORK/cmp.data" --no-children --sort sym --stdio -q 2>/dev/null |
            awk 'NF >= 3 { p = $1; $1 = ""; $2 = ""; sub(/^  */, ""); print p, $0 }')$'\n'
        "$TRAPLINE" run -q --profile -o "$WORK/cmp.trace" -- "$WORK/sqlite_cpu" "$SQLITE_N" >/dev/null 2>&1
        tl_all+=$("$TRAPLINE" profile "$WORK/cmp.trace" --no-inline --format json |
            jq -r '.functions[] | select(.self > 0) | "\(.self_percent) \(.function)"')$'\n'
    done
    local perf_top tl_top
    perf_top=$(printf '%s' "$perf_all" | grep . | average_top10 "$COMPARE_REPS")
    tl_top=$(printf '%s' "$tl_all" | grep . | average_top10 "$COMPARE_REPS")
    echo
    echo "### Top 10 functions by self time: SQLite workload ($SQLITE_N rows), mean of $COMPARE_REPS runs each"
    echo
    echo "| # | perf record -e cpu-clock -F 999 | % | trapline run --profile (--no-inline) | % |"
    echo "|---|---|---|---|---|"
    paste -d'\t' <(echo "$perf_top") <(echo "$tl_top") | awk -F'\t' '{
        split($1, a, " "); pa = a[1]; fa = substr($1, length(pa) + 2)
        split($2, b, " "); pb = b[1]; fb = substr($2, length(pb) + 2)
        printf "| %d | %s | %s | %s | %s |\n", NR, fa, pa, fb, pb }'
    local common maxdiff
    common=$(comm -12 <(echo "$perf_top" | cut -d' ' -f2- | sort) <(echo "$tl_top" | cut -d' ' -f2- | sort) | wc -l)
    maxdiff=$(awk 'NR == FNR { p[substr($0, index($0, " ") + 1)] = $1; next }
        { f = substr($0, index($0, " ") + 1); if (f in p) { d = p[f] - $1; if (d < 0) d = -d; if (d > m) { m = d; mf = f } } }
        END { printf "%.2f percentage points (%s)", m, mf }' \
        <(echo "$perf_top") <(printf '%s' "$tl_all" | grep . | average_top10_all "$COMPARE_REPS"))
    echo
    echo "Functions in both top-10 lists: $common of 10. Largest difference for a function of perf's top 10: $maxdiff."
}

# Like average_top10, every function.
average_top10_all() {
    awk -v runs="$1" '{ p = $1; sub(/%$/, "", p); $1 = ""; sub(/^ /, ""); s[$0] += p }
        END { for (f in s) printf "%.2f %s\n", s[f] / runs, f }'
}

setup
echo "## trapline CPU profiler vs perf ($(date -u +%Y-%m-%dT%H:%MZ), $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo
echo "Machine: nproc=$(nproc); $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo); kernel $(uname -r) (CONFIG_HZ $(zcat /proc/config.gz 2>/dev/null | sed -n 's/^CONFIG_HZ=//p' || echo '?')); load average at start: $(cut -d' ' -f1-3 /proc/loadavg); $(perf --version)"
case $WHAT in
    overhead | all)
        overhead "cpu_bound $CPU_ROUNDS (pure CPU, no allocation)" "$WORK/cpu_bound" "$CPU_ROUNDS"
        overhead "sqlite_cpu $SQLITE_N (SQLite, allocation-heavy)" "$WORK/sqlite_cpu" "$SQLITE_N"
        ;;&
    compare | all) compare ;;
    overhead) ;;
    *)
        echo "usage: $0 [overhead|compare|all]" >&2
        exit 2
        ;;
esac
