#!/usr/bin/env bash
# Lock benchmarks, side by side: native, trapline (full and --production),
# valgrind's helgrind and drd (and mutrace when installed). Called by `bench/run.sh locks` (and
# `all`); runs on its own too. See bench/README.md, "Locks".
#
#   1. Uncontended pthread_mutex_lock+unlock pair on one thread: ns per pair
#      (median of LOCK_REPS runs, timed inside the program around the loop)
#      and the overhead over native; plus user-mode instructions per pair
#      from `perf stat` (exact, unlike times on a busy machine).
#   2. Contended workload: LOCK_THREADS threads take one mutex around a
#      critical section of IN steps of work with OUT steps outside it, for
#      each IN:OUT of LOCK_WORK (a step is one multiply-add, about 1 ns);
#      operations per second and the ratio to native (median of LOCK_REPS).
#
# Knobs: LOCK_PAIRS=20000000 LOCK_REPS=5 LOCK_THREADS=2 LOCK_ROUNDS=1000000
#        LOCK_WORK="20:200 100:1000" (IN:OUT work steps per operation)
#        VG_PAIRS=500000 VG_ROUNDS=50000 (valgrind tools, one run each; 0: skip)
#        TRAPLINE=PATH NO_BUILD=1 as in run.sh.
# Benchmarks are measurements, not tests: nothing here asserts on timings.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
OUT=$BENCH_DIR/work/locks
TRAPLINE=${TRAPLINE:-$ROOT/target/release/trapline}
LOCK_PAIRS=${LOCK_PAIRS:-20000000}
LOCK_REPS=${LOCK_REPS:-5}
LOCK_THREADS=${LOCK_THREADS:-2}
LOCK_ROUNDS=${LOCK_ROUNDS:-1000000}
LOCK_WORK=${LOCK_WORK:-20:200 100:1000}
VG_PAIRS=${VG_PAIRS:-500000}
VG_ROUNDS=${VG_ROUNDS:-50000}

log() { printf '[bench locks] %s\n' "$*" >&2; }

median() {
    printf '%s\n' "$@" | { grep -E '^[0-9]+([.][0-9]+)?$' || true; } | sort -g | awk '{a[NR]=$1} END {
        if (NR == 0) { print "n/a"; exit }
        if (NR % 2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2] + a[NR/2+1]) / 2 }'
}
calc() {
    if [[ $* == *n/a* ]]; then echo "n/a"; return; fi
    awk "BEGIN { printf \"%.2f\", $* }"
}

mkdir -p "$OUT"
if [[ -z ${NO_BUILD:-} ]]; then
    log "cargo build --release -p trapline-cli -p trapline-agent"
    (cd "$ROOT" && cargo build --release -p trapline-cli -p trapline-agent >&2)
fi
gcc -O2 -fomit-frame-pointer -g -pthread -o "$OUT/locks" "$BENCH_DIR/src/locks.c"
PROG=$OUT/locks

# Runs the program under TOOL; prints the value of the line starting with KEY.
measure() {
    local tool=$1 key=$2
    shift 2
    local -a pre=()
    case $tool in
        native) ;;
        trapline) pre=("$TRAPLINE" run -q -o "$OUT/t.trace" --) ;;
        production) pre=("$TRAPLINE" run -q --production -o "$OUT/p.trace" --) ;;
        helgrind) pre=(valgrind -q --tool=helgrind) ;;
        drd) pre=(valgrind -q --tool=drd) ;;
        mutrace) pre=(mutrace) ;;
    esac
    "${pre[@]}" "$PROG" "$@" 2>"$OUT/$tool.stderr" | awk -v k="$key" '$1 == k {print $2}'
}

# User-mode instructions per pair: (instructions at 2N - at N) / N.
instructions_per_pair() {
    local tool=$1 n=1000000 a b
    local -a pre=()
    [[ $tool == trapline ]] && pre=("$TRAPLINE" run -q -o "$OUT/i.trace" --)
    command -v perf >/dev/null || { echo n/a; return; }
    a=$(perf stat -x, -e instructions:u "${pre[@]}" "$PROG" pair $n 2>&1 >/dev/null | awk -F, '/instructions/ {print $1}')
    b=$(perf stat -x, -e instructions:u "${pre[@]}" "$PROG" pair $((2 * n)) 2>&1 >/dev/null | awk -F, '/instructions/ {print $1}')
    [[ $a =~ ^[0-9]+$ && $b =~ ^[0-9]+$ ]] || { echo n/a; return; }
    calc "($b - $a) / $n"
}

TOOLS=(native trapline production)
command -v valgrind >/dev/null && TOOLS+=(helgrind drd)
command -v mutrace >/dev/null && TOOLS+=(mutrace)

echo "### Locks ($(date -u +%Y-%m-%dT%H:%MZ))"
echo
echo "Machine: nproc=$(nproc); $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "Tools: $(valgrind --version 2>/dev/null || echo 'no valgrind'); mutrace: $(command -v mutrace >/dev/null && echo installed || echo 'not installed (not in Debian)')"
echo
echo "Uncontended pthread_mutex_lock+unlock pair, one thread ($LOCK_PAIRS pairs, median of $LOCK_REPS; valgrind tools: $VG_PAIRS pairs, 1 run):"
echo
echo "| tool | ns per pair | added ns per pair | instructions per pair |"
echo "|---|---|---|---|"
native_pair=n/a
for tool in "${TOOLS[@]}"; do
    vals=()
    case $tool in
        native | trapline | production | mutrace)
            for ((i = 0; i < LOCK_REPS; i++)); do
                log "$tool pair run $((i + 1))/$LOCK_REPS"
                vals+=("$(measure "$tool" ns_per_pair pair "$LOCK_PAIRS")")
            done
            ;;
        *)
            ((VG_PAIRS > 0)) || continue
            log "$tool pair run"
            vals+=("$(measure "$tool" ns_per_pair pair "$VG_PAIRS")")
            ;;
    esac
    m=$(median "${vals[@]}")
    [[ $tool == native ]] && native_pair=$m
    ins=n/a
    [[ $tool == native || $tool == trapline ]] && ins=$(instructions_per_pair "$tool")
    echo "| $tool | $m (runs: ${vals[*]}) | $(calc "$m - $native_pair") | $ins |"
done
echo
for work in $LOCK_WORK; do
    win=${work%%:*} wout=${work##*:}
    echo
    echo "Contended: $LOCK_THREADS threads x $LOCK_ROUNDS rounds on one mutex, $win steps inside, $wout outside (median of $LOCK_REPS; valgrind tools: $VG_ROUNDS rounds, 1 run):"
    echo
    echo "| tool | operations per second | ratio to native |"
    echo "|---|---|---|"
    native_ops=n/a
    for tool in "${TOOLS[@]}"; do
        vals=()
        case $tool in
            native | trapline | production | mutrace)
                for ((i = 0; i < LOCK_REPS; i++)); do
                    log "$tool contended $work run $((i + 1))/$LOCK_REPS"
                    vals+=("$(measure "$tool" ops_per_sec contended "$LOCK_THREADS" "$LOCK_ROUNDS" "$win" "$wout")")
                done
                ;;
            *)
                ((VG_ROUNDS > 0)) || continue
                log "$tool contended $work run"
                vals+=("$(measure "$tool" ops_per_sec contended "$LOCK_THREADS" "$VG_ROUNDS" "$win" "$wout")")
                ;;
        esac
        m=$(median "${vals[@]}")
        [[ $tool == native ]] && native_ops=$m
        echo "| $tool | $m (runs: ${vals[*]}) | $(calc "$m / $native_ops") |"
    done
    if [[ -f $OUT/t.trace ]]; then
        echo
        echo "trapline's totals for its last run: $("$TRAPLINE" locks "$OUT/t.trace" | sed -n 3p | sed 's/^==[0-9]*== //')"
    fi
done
