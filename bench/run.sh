#!/usr/bin/env bash
# Side-by-side benchmarks: native vs trapline vs heaptrack (and valgrind for
# the record). See bench/README.md for what each one measures.
#
#   bench/run.sh [micro|threads|spawn|cc1|memory|locks|scan|profile|all]     (default: all; scan: bench/scan.sh, profile: bench/profile.sh)
#
# Knobs (environment):
#   MICRO_N=5000000        malloc+free pairs per micro run
#   MICRO_REPS=5           repetitions per tool for micro
#   VALGRIND_N=1000000     pairs for the single valgrind memcheck run (0: skip)
#   THREADS_N=10000000     malloc+free pairs per threads run, split over the threads
#   THREADS_COUNTS="1 2 4 8"  thread counts for the threads benchmark
#   THREADS_REPS=3         repetitions per tool and thread count
#   CC1_REPS=3             repetitions per tool for cc1 (sqlite3.c is ~40 s native)
#   CC1_HEAPTRACK_REPS=1   heaptrack repetitions for cc1 (it is slow; 0: skip)
#   CC1_NO_RELEASE_STACKS=1  also run cc1 under `trapline run --no-release-stacks` (0: skip)
#   SPAWN_PROCS=300        fork+exec pairs per spawn run (processes)
#   SPAWN_THREADS=20000    thread start+join pairs per spawn run (threads)
#   SPAWN_REPS=5           repetitions per tool for spawn
#   MEM_KS="1000000 10000000"  live-block counts for the memory benchmark
#   MEM_REPS=3             repetitions per tool and K for memory
#   CC1_SOURCE=FILE.c      compile FILE.c instead of sqlite3.c (to try the script)
#   HEAPTRACK_TIMEOUT=600  seconds before a heaptrack run is killed
#   HEAPTRACK_AS_LIMIT=16G address-space limit (prlimit --as) for every process
#                          of a heaptrack run, so it cannot take the machine down
#   TRAPLINE_ARGS=         extra `trapline run` options, e.g. -q (no end summary)
#   TRAPLINE=PATH          the trapline CLI (default target/release/trapline; the
#                          agent is looked for beside it). Both are copied to
#                          bench/work/measured first, and the copies measured
#   NO_BUILD=1             skip `cargo build --release`
#   NO_INSTALL=1           never apt-get install missing tools
#
# Benchmarks are measurements, not tests: nothing here asserts on timings.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/sqlite.sh
. "$BENCH_DIR/sqlite.sh"
WORK=$BENCH_DIR/work
BIN=$WORK/bin
OUT=$WORK/out

MICRO_N=${MICRO_N:-5000000}
MICRO_REPS=${MICRO_REPS:-5}
THREADS_N=${THREADS_N:-10000000}
THREADS_COUNTS=${THREADS_COUNTS:-"1 2 4 8"}
THREADS_REPS=${THREADS_REPS:-3}
VALGRIND_N=${VALGRIND_N:-1000000}
CC1_REPS=${CC1_REPS:-3}
CC1_HEAPTRACK_REPS=${CC1_HEAPTRACK_REPS:-1}
SPAWN_PROCS=${SPAWN_PROCS:-300}
SPAWN_THREADS=${SPAWN_THREADS:-20000}
SPAWN_REPS=${SPAWN_REPS:-5}
MEM_KS=${MEM_KS:-"1000000 10000000"}
MEM_REPS=${MEM_REPS:-3}
HEAPTRACK_TIMEOUT=${HEAPTRACK_TIMEOUT:-600}
HEAPTRACK_AS_LIMIT=${HEAPTRACK_AS_LIMIT:-16G}

TRAPLINE=${TRAPLINE:-$ROOT/target/release/trapline}
AGENT=${TRAPLINE_AGENT:-$(dirname "$TRAPLINE")/libtrapline_agent.so}

WHAT=${1:-all}
[[ $WHAT == locks ]] && exec "$BENCH_DIR/locks.sh" # lock benchmarks (bench/locks.sh)
case $WHAT in
    micro | threads | spawn | cc1 | memory | scan | profile | all) ;;
    -h | --help)
        sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "usage: $0 [micro|threads|cc1|memory|scan|profile|all]" >&2
        exit 2
        ;;
esac

log() { printf '[bench] %s\n' "$*" >&2; }

# ---------------------------------------------------------------- helpers

# Size in bytes for "16G"-style values (prlimit wants bytes).
to_bytes() {
    local v=$1
    case $v in
        *[Gg]) echo $((${v%?} * 1024 * 1024 * 1024)) ;;
        *[Mm]) echo $((${v%?} * 1024 * 1024)) ;;
        *) echo "$v" ;;
    esac
}

# Median of numbers given as arguments (mean of the two middle ones if even).
median() {
    printf '%s\n' "$@" | { grep -E '^-?[0-9]+([.][0-9]+)?$' || true; } | sort -g | awk '{a[NR]=$1} END {
        if (NR == 0) { print "n/a"; exit }
        if (NR % 2) print a[(NR+1)/2]; else printf "%.6f\n", (a[NR/2] + a[NR/2+1]) / 2 }'
}

# fmt PRINTF_FORMAT VALUE: "n/a" passes through.
fmt() {
    if [[ $2 == n/a || $2 == nan || -z $2 ]]; then echo "n/a"; else printf "$1" "$2"; fi
}

# calc EXPR: floating point via awk; "n/a" if any operand is n/a.
calc() {
    if [[ $* == *n/a* || $* == *nan* ]]; then echo "n/a"; return; fi
    awk "BEGIN { printf \"%.6f\", $* }"
}

now() { echo "$EPOCHREALTIME"; }

machine_line() {
    local cpu glibc
    cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
    glibc=$(ldd --version 2>&1 | sed -n 1p | awk '{print $NF}')
    printf 'Machine: nproc=%s; CPU: %s; kernel %s; glibc %s; RAM %s; load average at start: %s\n' \
        "$(nproc)" "${cpu:-unknown}" "$(uname -r)" "$glibc" \
        "$(awk '/^MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)" \
        "$(cut -d' ' -f1-3 /proc/loadavg)"
}

# ---------------------------------------------------------------- setup

ensure_tools() {
    local missing=()
    command -v gcc >/dev/null || missing+=(gcc)
    command -v heaptrack >/dev/null || missing+=(heaptrack)
    command -v heaptrack_print >/dev/null || missing+=(heaptrack)
    [[ -x /usr/bin/time ]] || missing+=(time)
    command -v valgrind >/dev/null || missing+=(valgrind)
    command -v prlimit >/dev/null || missing+=(util-linux)
    command -v jq >/dev/null || missing+=(jq)
    if ((${#missing[@]})); then
        if [[ -n ${NO_INSTALL:-} ]]; then
            log "missing tools (NO_INSTALL set, not installing): ${missing[*]}"
        else
            log "installing: ${missing[*]}"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
        fi
    fi
}

build() {
    mkdir -p "$BIN" "$OUT"
    if [[ -z ${NO_BUILD:-} ]]; then
        log "cargo build --release (workspace)"
        if ! (cd "$ROOT" && cargo build --release >&2); then
            log "cargo build --release FAILED: trapline columns will be n/a"
        fi
    fi
    # Measure copies: a build in another shell during a long run must not
    # swap the agent under the measurement (the CLI finds the agent beside
    # itself, so both are copied).
    if [[ -x $TRAPLINE && -f $AGENT ]]; then
        local measured=$WORK/measured
        mkdir -p "$measured"
        cp -p "$TRAPLINE" "$measured/trapline"
        cp -p "$AGENT" "$measured/libtrapline_agent.so"
        TRAPLINE=$measured/trapline
        AGENT=$measured/libtrapline_agent.so
        export TRAPLINE_AGENT=$AGENT
    fi
    # Like Debian binaries: -O2, no frame pointers; -g only adds debug info.
    local cflags=(-O2 -fomit-frame-pointer -g)
    gcc "${cflags[@]}" -o "$BIN/depth" "$BENCH_DIR/src/depth.c"
    gcc "${cflags[@]}" -o "$BIN/live" "$BENCH_DIR/src/live.c"
    gcc "${cflags[@]}" -pthread -o "$BIN/threads_pairs" "$BENCH_DIR/src/threads_pairs.c"
    gcc "${cflags[@]}" -pthread -o "$BIN/spawn" "$BENCH_DIR/src/spawn.c"
}

# Is trapline able to record? Sets TRAPLINE_OK=1 or explains why not.
TRAPLINE_OK=0
TRAPLINE_WHY=""
check_trapline() {
    if [[ ! -x $TRAPLINE ]]; then
        TRAPLINE_WHY="$TRAPLINE does not exist"
    elif [[ ! -f $AGENT ]]; then
        TRAPLINE_WHY="$AGENT does not exist"
    else
        local t=$OUT/probe.trace rc=0
        rm -f "$t"
        "$TRAPLINE" run -o "$t" -- /bin/true >"$OUT/probe.log" 2>&1 || rc=$?
        if ((rc != 0)); then
            TRAPLINE_WHY="'trapline run -o T -- /bin/true' exited $rc: $(head -c 300 "$OUT/probe.log" | tr '\n' ' ')"
        elif [[ ! -s $t ]]; then
            TRAPLINE_WHY="'trapline run -o T -- /bin/true' wrote no trace"
        else
            TRAPLINE_OK=1
        fi
    fi
    if ((TRAPLINE_OK)); then
        log "trapline: OK ($TRAPLINE)"
    else
        log "trapline: NOT AVAILABLE, its columns will be n/a: $TRAPLINE_WHY"
    fi
}

# Identity of the trapline build measured: the agent's hash and time.
agent_identity() {
    if [[ -f $AGENT ]]; then
        printf '%s (agent sha256 %s, built %s)' "$("$TRAPLINE" --version 2>/dev/null || echo trapline)" \
            "$(sha256sum "$AGENT" | cut -c1-12)" "$(date -u -r "$AGENT" +%Y-%m-%dT%H:%M:%SZ)"
    else
        echo "no agent"
    fi
}

heaptrack_version() { heaptrack --version 2>/dev/null | sed -n 1p || echo "heaptrack ?"; }

# Bytes of a trace written at path P (P itself, or P.* if the tool appends
# a suffix or splits the trace).
trace_bytes() {
    local total=0 f s
    for f in "$1" "$1".*; do
        [[ -f $f ]] || continue
        s=$(stat -c %s "$f")
        total=$((total + s))
    done
    echo "$total"
}

# Runs "$@" under TOOL (native|trapline|heaptrack|valgrind), writing the
# tool's output file to $OUT/<tag>.*. Sets RUN_WALL (seconds, including the
# tool's start-up and finalisation), RUN_RC, RUN_TREE_RSS_KIB (GNU time %M:
# the peak RSS of the largest single process of the tree, see README) and
# RUN_STDOUT (the measured program's stdout file).
run_tool() {
    local tool=$1 tag=$2
    shift 2
    local stdout=$OUT/$tag.stdout stderr=$OUT/$tag.stderr timef=$OUT/$tag.time
    local -a pre=()
    case $tool in
        native) ;;
        trapline)
            rm -f "$OUT/$tag.trace" "$OUT/$tag.trace".*
            # shellcheck disable=SC2206
            pre=("$TRAPLINE" run ${TRAPLINE_ARGS:-} -o "$OUT/$tag.trace" --)
            ;;
        trapline-norel)
            rm -f "$OUT/$tag.trace" "$OUT/$tag.trace".*
            # shellcheck disable=SC2206
            pre=("$TRAPLINE" run --no-release-stacks ${TRAPLINE_ARGS:-} -o "$OUT/$tag.trace" --)
            ;;
        heaptrack)
            rm -f "$OUT/$tag.heaptrack".*
            pre=(timeout "$HEAPTRACK_TIMEOUT" prlimit --as="$(to_bytes "$HEAPTRACK_AS_LIMIT")"
                heaptrack -o "$OUT/$tag.heaptrack")
            ;;
        valgrind)
            pre=(valgrind --tool=memcheck --log-file="$OUT/$tag.valgrind")
            ;;
    esac
    local t0 t1
    RUN_RC=0
    t0=$(now)
    /usr/bin/time -f '%M %e %U %S' -o "$timef" "${pre[@]}" "$@" >"$stdout" 2>"$stderr" || RUN_RC=$?
    t1=$(now)
    RUN_WALL=$(calc "$t1 - $t0")
    RUN_TREE_RSS_KIB=$(awk 'END {print $1}' "$timef" 2>/dev/null || echo n/a)
    RUN_CPU=$(awk 'END {printf "%.2f", $3 + $4}' "$timef" 2>/dev/null || echo n/a)
    [[ $RUN_TREE_RSS_KIB =~ ^[0-9]+$ ]] || RUN_TREE_RSS_KIB=n/a
    RUN_STDOUT=$stdout
    if ((RUN_RC != 0)); then
        log "$tag: exit status $RUN_RC (stderr tail: $(tail -c 300 "$stderr" | tr '\n' ' '))"
    fi
}

# Peak RSS (VmHWM, KiB) of the processes among this script's descendants
# whose executable is one of EXE..., sampled every 50 ms from /proc while
# FLAGFILE exists; the largest single process's peak is written to OUTFILE
# ("n/a" if none was seen). Misses only growth in a process's last <50 ms.
sample_hwm() {
    local flag=$1 outfile=$2
    shift 2
    local best=0 line v pid
    echo n/a >"$outfile"
    while [[ -e $flag ]]; do
        for pid in $(find_desc "$$" "$@"); do
            while read -r line; do
                if [[ $line == VmHWM:* ]]; then
                    v=${line//[!0-9]/}
                    if ((v > best)); then
                        best=$v
                        echo "$best" >"$outfile"
                    fi
                fi
            done </proc/"$pid"/status 2>/dev/null || true
        done
        sleep 0.05
    done
}

# Descendants of PID whose /proc/N/exe is one of the files EXE...
find_desc() {
    local root=$1 p c e
    shift
    local -a queue=("$root") kids
    while ((${#queue[@]})); do
        p=${queue[0]}
        queue=("${queue[@]:1}")
        for e in "$@"; do
            if [[ /proc/$p/exe -ef $e ]]; then
                echo "$p"
                break
            fi
        done
        for c in /proc/"$p"/task/*/children; do
            [[ -r $c ]] || continue
            kids=()
            read -r -a kids <"$c" 2>/dev/null || true
            queue+=("${kids[@]}")
        done
    done
}

# Executables of each tool's own helper processes (not the measured program).
tool_exes() {
    case $1 in
        trapline | trapline-norel) echo "$TRAPLINE" ;;
        heaptrack)
            local d
            for d in /usr/lib/heaptrack/libexec /usr/lib/*/heaptrack/libexec; do
                [[ -x $d/heaptrack_interpret ]] && echo "$d/heaptrack_interpret"
            done
            command -v zstd gzip 2>/dev/null || true
            ;;
    esac
}

# Starts the samplers for a run tagged TAG of TOOL measuring executable EXE:
# $OUT/TAG.hwm (the program) and $OUT/TAG.toolhwm (the tool's processes).
start_samplers() {
    local tag=$1 tool=$2 exe=$3
    SAMPLE_FLAG=$OUT/$tag.running
    touch "$SAMPLE_FLAG"
    sample_hwm "$SAMPLE_FLAG" "$OUT/$tag.hwm" "$exe" &
    SAMPLER_PIDS=($!)
    local -a texes
    mapfile -t texes < <(tool_exes "$tool")
    if ((${#texes[@]})); then
        sample_hwm "$SAMPLE_FLAG" "$OUT/$tag.toolhwm" "${texes[@]}" &
        SAMPLER_PIDS+=($!)
    else
        echo n/a >"$OUT/$tag.toolhwm"
    fi
}

stop_samplers() {
    rm -f "$SAMPLE_FLAG"
    local p
    for p in "${SAMPLER_PIDS[@]}"; do wait "$p" || true; done
}

# ---------------------------------------------------------------- micro

# ns per pair as printed by depth ("ns_per_pair=X"): the loop alone.
loop_ns() { sed -n 's/.*ns_per_pair=\([0-9.]*\).*/\1/p' "$1"; }

bench_micro() {
    log "micro: $MICRO_REPS reps x N=$MICRO_N malloc+free pairs at depth 20"
    local -a tools=(native heaptrack)
    ((TRAPLINE_OK)) && tools=(native trapline heaptrack)
    declare -A loops walls
    local r tool
    # Interleave tools per repetition so drift in machine load hits all alike.
    for ((r = 1; r <= MICRO_REPS; r++)); do
        for tool in "${tools[@]}"; do
            run_tool "$tool" "micro-$tool-$r" "$BIN/depth" "$MICRO_N"
            if ((RUN_RC == 0)); then
                loops[$tool]+="$(loop_ns "$RUN_STDOUT") "
                walls[$tool]+="$RUN_WALL "
            fi
            log "micro rep $r $tool: wall ${RUN_WALL}s, loop $(loop_ns "$RUN_STDOUT") ns/pair"
        done
    done
    local vg_loop=n/a vg_wall=n/a
    if ((VALGRIND_N > 0)); then
        run_tool valgrind micro-valgrind "$BIN/depth" "$VALGRIND_N"
        if ((RUN_RC == 0)); then
            vg_loop=$(loop_ns "$RUN_STDOUT")
            vg_wall=$RUN_WALL
        fi
    fi

    local nat_loop nat_wall
    # shellcheck disable=SC2086
    nat_loop=$(median ${loops[native]})
    # shellcheck disable=SC2086
    nat_wall=$(median ${walls[native]})
    echo
    echo "### Microbenchmark: malloc+free pairs at call depth 20"
    echo
    echo "N = $MICRO_N pairs, sizes 16..256 B, $MICRO_REPS repetitions, medians."
    echo "\"loop\" is timed inside the program around the loop only; \"wall\" is the"
    echo "whole command including the tool's start-up and finalisation."
    echo
    echo "| tool | loop ns/pair | ns added/pair (loop) | wall s | ns added/pair (wall) | wall ratio |"
    echo "|---|---:|---:|---:|---:|---:|"
    for tool in native trapline heaptrack; do
        local l w
        if [[ -n ${loops[$tool]:-} ]]; then
            # shellcheck disable=SC2086
            l=$(median ${loops[$tool]})
            # shellcheck disable=SC2086
            w=$(median ${walls[$tool]})
        else
            l=n/a w=n/a
        fi
        local name=$tool
        [[ $tool == trapline && $TRAPLINE_OK == 0 ]] && name="trapline (not available)"
        [[ $tool == heaptrack ]] && name="$(heaptrack_version)"
        printf '| %s | %s | %s | %s | %s | %s |\n' "$name" \
            "$(fmt %.2f "$l")" "$(fmt %.2f "$(calc "$l - $nat_loop")")" \
            "$(fmt %.3f "$w")" "$(fmt %.2f "$(calc "($w - $nat_wall) * 1e9 / $MICRO_N")")" \
            "$(fmt %.2fx "$(calc "$w / $nat_wall")")"
    done
    if ((VALGRIND_N > 0)); then
        printf '| %s memcheck (N=%s, 1 run) | %s | %s | %s | (start-up dominated) | |\n' \
            "$(valgrind --version)" "$VALGRIND_N" \
            "$(fmt %.2f "$vg_loop")" "$(fmt %.2f "$(calc "$vg_loop - $nat_loop")")" \
            "$(fmt %.3f "$vg_wall")"
    fi
    echo
    echo "Target: trapline adds at most 60 ns per pair."
    ((TRAPLINE_OK)) || echo "trapline column pending: $TRAPLINE_WHY"
}

# ---------------------------------------------------------------- threads

# Seconds the threads' work took, as printed by threads_pairs ("loop_s=X").
loop_s() { sed -n 's/.*loop_s=\([0-9.]*\).*/\1/p' "$1"; }

bench_threads() {
    log "threads: $THREADS_REPS reps x N=$THREADS_N pairs in $THREADS_COUNTS threads"
    local -a tools=(native heaptrack)
    ((TRAPLINE_OK)) && tools=(native trapline heaptrack)
    declare -A loops
    local r tool t
    for ((r = 1; r <= THREADS_REPS; r++)); do
        for t in $THREADS_COUNTS; do
            for tool in "${tools[@]}"; do
                run_tool "$tool" "threads-$tool-$t-$r" "$BIN/threads_pairs" "$THREADS_N" "$t"
                ((RUN_RC == 0)) && loops[$tool-$t]+="$(loop_s "$RUN_STDOUT") "
                log "threads rep $r T=$t $tool: loop $(loop_s "$RUN_STDOUT") s"
            done
        done
    done
    echo
    echo "### Threads: malloc+free pairs in T threads at once"
    echo
    echo "N = $THREADS_N pairs split over the threads (each keeps 64 blocks live,"
    echo "sizes 16..271 B), $THREADS_REPS repetitions, medians of the time the"
    echo "threads' work took (timed inside the program). On a machine with fewer"
    echo "cores than threads the threads share them."
    echo
    echo "| threads | native s | trapline s | trapline ratio | ns added/pair | heaptrack s | heaptrack ratio |"
    echo "|---:|---:|---:|---:|---:|---:|---:|"
    for t in $THREADS_COUNTS; do
        local nat tl ht
        # shellcheck disable=SC2086
        nat=$(median ${loops[native-$t]:-})
        # shellcheck disable=SC2086
        tl=$(median ${loops[trapline-$t]:-})
        # shellcheck disable=SC2086
        ht=$(median ${loops[heaptrack-$t]:-})
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$(fmt %.3f "$nat")" \
            "$(fmt %.3f "$tl")" "$(fmt %.2fx "$(calc "$tl / $nat")")" \
            "$(fmt %.1f "$(calc "($tl - $nat) * 1e9 / $THREADS_N")")" \
            "$(fmt %.3f "$ht")" "$(fmt %.2fx "$(calc "$ht / $nat")")"
    done
}

# ---------------------------------------------------------------- spawn

bench_spawn() {
    log "spawn: $SPAWN_REPS reps x $SPAWN_PROCS fork+exec of /bin/true, $SPAWN_THREADS thread start+join"
    local -a tools=(native heaptrack valgrind)
    ((TRAPLINE_OK)) && tools=(native trapline heaptrack valgrind)
    declare -A loops
    local r tool kind n
    for ((r = 1; r <= SPAWN_REPS; r++)); do
        for kind in procs threads; do
            n=$SPAWN_PROCS
            [[ $kind == threads ]] && n=$SPAWN_THREADS
            for tool in "${tools[@]}"; do
                # One memcheck run each: it takes seconds per thousand.
                [[ $tool == valgrind ]] && ((r > 1)) && continue
                run_tool "$tool" "spawn-$tool-$kind-$r" "$BIN/spawn" "$kind" "$n"
                ((RUN_RC == 0)) && loops[$tool-$kind]+="$(loop_s "$RUN_STDOUT") "
                log "spawn rep $r $kind $tool: loop $(loop_s "$RUN_STDOUT") s"
            done
        done
    done
    echo
    echo "### Spawn: starting and ending processes and threads"
    echo
    echo "$SPAWN_PROCS fork+exec+wait of /bin/true, one at a time (each child and"
    echo "each exec'd image is a traced process with its own trace, exit scan"
    echo "included), and $SPAWN_THREADS pthread_create+join, one at a time (each"
    echo "thread allocates and frees one block). Medians of $SPAWN_REPS repetitions"
    echo "(memcheck: one run, children not followed) of the loop's time, timed"
    echo "inside the program, and the microseconds added per process or thread."
    echo
    echo "| loop | native s | trapline s | added us | heaptrack s | added us | memcheck s | added us |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for kind in procs threads; do
        n=$SPAWN_PROCS
        [[ $kind == threads ]] && n=$SPAWN_THREADS
        local nat tl ht vg
        # shellcheck disable=SC2086
        nat=$(median ${loops[native-$kind]:-})
        # shellcheck disable=SC2086
        tl=$(median ${loops[trapline-$kind]:-})
        # shellcheck disable=SC2086
        ht=$(median ${loops[heaptrack-$kind]:-})
        # shellcheck disable=SC2086
        vg=$(median ${loops[valgrind-$kind]:-})
        printf '| %s x %s | %s | %s | %s | %s | %s | %s | %s |\n' "$kind" "$n" "$(fmt %.3f "$nat")" \
            "$(fmt %.3f "$tl")" "$(fmt %.1f "$(calc "($tl - $nat) * 1e6 / $n")")" \
            "$(fmt %.3f "$ht")" "$(fmt %.1f "$(calc "($ht - $nat) * 1e6 / $n")")" \
            "$(fmt %.3f "$vg")" "$(fmt %.1f "$(calc "($vg - $nat) * 1e6 / $n")")"
    done
}

# ---------------------------------------------------------------- cc1

fetch_sqlite() {
    SQLITE_C=$(fetch_sqlite_into "$WORK/sqlite-fetch") || return 1
    log "sqlite3.c: $SQLITE_C ($(stat -c %s "$SQLITE_C") bytes)"
}

# Allocation calls heaptrack counted ("calls to allocation functions: N").
heaptrack_alloc_calls() {
    local f
    f=$(ls "$1".* 2>/dev/null | sed -n 1p) || true
    [[ -n $f ]] || { echo n/a; return; }
    timeout 900 heaptrack_print -f "$f" -T 0 -l 0 -a 0 -p 0 2>/dev/null |
        sed -n 's/^calls to allocation functions: \([0-9]*\).*/\1/p' | sed -n 1p | grep . || echo n/a
}

# Events in a trapline trace, from `trapline stats --format json` (first
# integer field named "events", at any depth).
trapline_events() {
    local j
    if j=$("$TRAPLINE" stats "$1" --format json 2>/dev/null); then
        echo "$j" | jq -r '[.. | objects | .events? | numbers] | first // "n/a"' 2>/dev/null || echo n/a
    else
        echo n/a
    fi
}

bench_cc1() {
    if [[ -n ${CC1_SOURCE:-} ]]; then
        SQLITE_C=$CC1_SOURCE
    else
        fetch_sqlite
    fi
    local cc1 multiarch
    cc1=$(gcc -print-prog-name=cc1)
    multiarch=$(gcc -print-multiarch)
    # What `gcc -O2 -c sqlite3.c` runs as its cc1 step (see `gcc -###`),
    # writing assembly; preprocessing included.
    local -a cmd=("$cc1" -quiet -imultiarch "$multiarch" -O2 "$SQLITE_C" -o "$OUT/cc1-out.s")
    log "cc1: ${cmd[*]}"
    local -a tools=(native)
    ((TRAPLINE_OK)) && tools+=(trapline)
    ((TRAPLINE_OK && ${CC1_NO_RELEASE_STACKS:-1})) && tools+=(trapline-norel)
    ((CC1_HEAPTRACK_REPS > 0)) && tools+=(heaptrack)
    declare -A walls cpus rss toolrss tree ok fails
    local r tool reps
    for ((r = 1; r <= CC1_REPS; r++)); do
        for tool in "${tools[@]}"; do
            reps=$CC1_REPS
            [[ $tool == heaptrack ]] && reps=$CC1_HEAPTRACK_REPS
            ((r <= reps)) || continue
            local tag=cc1-$tool-$r
            # cc1's own peak RSS, separate from the tool's processes: sampled
            # from /proc while the run lasts.
            start_samplers "$tag" "$tool" "$cc1"
            run_tool "$tool" "$tag" "${cmd[@]}"
            stop_samplers
            local hwm thwm
            hwm=$(cat "$OUT/$tag.hwm")
            thwm=$(cat "$OUT/$tag.toolhwm")
            log "cc1 rep $r $tool: wall ${RUN_WALL}s cpu ${RUN_CPU}s rc=$RUN_RC cc1 peak RSS $hwm KiB, tool processes $thwm KiB, largest process ${RUN_TREE_RSS_KIB} KiB"
            rss[$tool]+="$hwm "
            toolrss[$tool]+="$thwm "
            tree[$tool]+="$RUN_TREE_RSS_KIB "
            if ((RUN_RC == 0)); then
                walls[$tool]+="$RUN_WALL "
                cpus[$tool]+="$RUN_CPU "
                ok[$tool]=1
            else
                local why
                why=$(grep -h -e '^Command' "$OUT/$tag.time" 2>/dev/null | sed -n 1p) || true
                ((RUN_RC == 124)) && why="killed by timeout after ${HEAPTRACK_TIMEOUT}s"
                local errs
                errs=$(grep -v -e '^heaptrack output' -e '^starting app' -e '^/usr/lib' -e '^Heaptrack finished' \
                    -e 'heaptrack --analyze' -e '^ *$' "$OUT/$tag.stderr" 2>/dev/null | sed -n 1,3p | tr '\n' ' ') || true
                fails[$tool]+="rep $r after ${RUN_WALL}s: exit $RUN_RC ($why); stderr: ${errs:-none}. "
                walls_fail[$tool]+="$RUN_WALL "
            fi
        done
    done

    # Trace sizes and event counts of the last good run of each tool.
    local tr_bytes=n/a tr_events=n/a ht_bytes=n/a ht_calls=n/a
    if [[ -n ${ok[trapline]:-} ]]; then
        tr_bytes=$(trace_bytes "$OUT/cc1-trapline-1.trace")
        tr_events=$(trapline_events "$OUT/cc1-trapline-1.trace")
    fi
    local hf
    hf=$(ls "$OUT"/cc1-heaptrack-1.heaptrack.* 2>/dev/null | sed -n 1p) || true
    if [[ -n $hf ]]; then
        ht_bytes=$(stat -c %s "$hf")
        [[ -n ${ok[heaptrack]:-} ]] && ht_calls=$(heaptrack_alloc_calls "$OUT/cc1-heaptrack-1.heaptrack")
    fi
    # With no `trapline stats` event count, fall back to heaptrack's count of
    # allocation calls (frees not included).
    local per_event=n/a per_label="events from trapline stats"
    if [[ $tr_bytes != n/a ]]; then
        if [[ $tr_events != n/a ]]; then
            per_event=$(calc "$tr_bytes / $tr_events")
        elif [[ $ht_calls != n/a ]]; then
            per_event=$(calc "$tr_bytes / $ht_calls")
            per_label="allocation calls counted by heaptrack_print (trapline stats unavailable)"
        fi
    fi

    local nat
    # shellcheck disable=SC2086
    nat=$(median ${walls[native]:-})
    local natc
    # shellcheck disable=SC2086
    natc=$(median ${cpus[native]:-})
    echo
    local what="the libsqlite3-sys 0.30.1 amalgamation"
    [[ -n ${CC1_SOURCE:-} ]] && what="CC1_SOURCE"
    echo "### GCC cc1 compiling $(basename "$SQLITE_C") ($(stat -c %s "$SQLITE_C") bytes, $what)"
    echo
    echo "\`cc1 -quiet -imultiarch $multiarch -O2 $(basename "$SQLITE_C") -o out.s\` (one process). Medians of"
    echo "$CC1_REPS runs (heaptrack: $CC1_HEAPTRACK_REPS, limited to ${HEAPTRACK_TIMEOUT}s and"
    echo "\`prlimit --as=$HEAPTRACK_AS_LIMIT\`). \"cc1 peak RSS\" is cc1's own VmHWM sampled from /proc;"
    echo "\"tool process peak RSS\" is the largest of the tool's own processes (trapline CLI;"
    echo "heaptrack_interpret, zstd), sampled the same way; \"largest process peak RSS\" is GNU time's %M,"
    echo "the largest single process of the command's tree (what \`/usr/bin/time -f %M\` reports)."
    echo
    echo "| tool | wall s | ratio to native | CPU s (user+sys, all processes) | CPU ratio | cc1 peak RSS MiB | tool process peak RSS MiB | largest process peak RSS MiB | output file bytes | outcome |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    for tool in native trapline trapline-norel heaptrack; do
        [[ $tool == trapline-norel && -z ${walls[$tool]:-}${fails[$tool]:-} ]] && continue
        # Not run: no row (a leftover output file would look like a result).
        [[ $tool == heaptrack ]] && ((CC1_HEAPTRACK_REPS == 0)) && continue
        local w=n/a c=n/a h t th name=$tool outcome=ok bytes=
        # shellcheck disable=SC2086
        th=$(median ${toolrss[$tool]:-})
        # shellcheck disable=SC2086
        [[ -n ${walls[$tool]:-} ]] && w=$(median ${walls[$tool]}) && c=$(median ${cpus[$tool]})
        # shellcheck disable=SC2086
        h=$(median ${rss[$tool]:-})
        # shellcheck disable=SC2086
        t=$(median ${tree[$tool]:-})
        case $tool in
            trapline)
                ((TRAPLINE_OK)) || { name="trapline (not available)"; outcome="pending"; }
                bytes=$tr_bytes
                ;;
            trapline-norel)
                name="trapline --no-release-stacks"
                bytes=$(trace_bytes "$OUT/cc1-trapline-norel-1.trace")
                ;;
            heaptrack)
                name=$(heaptrack_version)
                bytes=$ht_bytes
                ;;
        esac
        [[ -n ${fails[$tool]:-} ]] && outcome="FAILED ${fails[$tool]}"
        printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$(fmt %.2f "$w")" \
            "$(fmt %.2fx "$(calc "$w / $nat")")" "$(fmt %.2f "$c")" "$(fmt %.2fx "$(calc "$c / $natc")")" \
            "$(fmt %.0f "$(calc "$h / 1024")")" "$(fmt %.0f "$(calc "$th / 1024")")" "$(fmt %.0f "$(calc "$t / 1024")")" \
            "${bytes:-}" "$outcome"
    done
    if [[ -n ${walls_fail[heaptrack]:-} ]]; then
        echo
        echo "heaptrack failed runs' wall times (s): ${walls_fail[heaptrack]}"
    fi
    echo
    echo "trapline trace bytes per event: $(fmt %.2f "$per_event") ($per_label; trace $tr_bytes bytes, events $tr_events)."
    echo "heaptrack allocation calls: $ht_calls; heaptrack file bytes per allocation call: $(fmt %.2f "$(calc "$ht_bytes / $ht_calls")")."
    echo
    echo "Target: trapline at most 1.25x native."
    ((TRAPLINE_OK)) || echo "trapline column pending: $TRAPLINE_WHY"
}
declare -A walls_fail

# ---------------------------------------------------------------- memory

bench_memory() {
    local -a tools=(native heaptrack)
    ((TRAPLINE_OK)) && tools=(native trapline heaptrack)
    declare -A after before treep toolp
    local k r tool
    for k in $MEM_KS; do
        for ((r = 1; r <= MEM_REPS; r++)); do
            for tool in "${tools[@]}"; do
                start_samplers "mem-$k-$tool-$r" "$tool" "$BIN/live"
                run_tool "$tool" "mem-$k-$tool-$r" "$BIN/live" "$k"
                stop_samplers
                if ((RUN_RC == 0)); then
                    toolp[$k,$tool]+="$(cat "$OUT/mem-$k-$tool-$r.toolhwm") "
                    after[$k,$tool]+="$(sed -n 's/.* rss_kib=\([0-9]*\).*/\1/p' "$RUN_STDOUT") "
                    before[$k,$tool]+="$(sed -n 's/.*rss_before_kib=\([0-9]*\).*/\1/p' "$RUN_STDOUT") "
                    treep[$k,$tool]+="$RUN_TREE_RSS_KIB "
                fi
                log "memory K=$k rep $r $tool: $(grep -h blocks= "$RUN_STDOUT" || echo "no result")"
            done
        done
    done
    echo
    echo "### Memory per live allocation"
    echo
    echo "The program allocates K blocks of 8..32 bytes, keeps them all live and reads its own"
    echo "VmRSS. Medians of $MEM_REPS runs. \"added B/alloc\" = (RSS_tool - RSS_native) / K;"
    echo "\"RSS at start\" is read before the first allocation (the tool's fixed cost so far)."
    echo "\"tool processes\" is the peak RSS of the largest of the tool's own processes (trapline"
    echo "CLI; heaptrack_interpret, which keeps heaptrack's per-allocation state outside the traced"
    echo "process, and zstd), sampled from /proc every 50 ms; \"largest process\" is GNU time's %M."
    echo
    echo "| K | tool | RSS at start KiB | RSS after K allocs KiB | added B/alloc | tool processes peak KiB | largest process peak KiB |"
    echo "|---:|---|---:|---:|---:|---:|---:|"
    for k in $MEM_KS; do
        local nat
        # shellcheck disable=SC2086
        nat=$(median ${after[$k,native]})
        for tool in native trapline heaptrack; do
            local a=n/a b=n/a tp=n/a op=n/a name=$tool
            # shellcheck disable=SC2086
            if [[ -n ${after[$k,$tool]:-} ]]; then
                a=$(median ${after[$k,$tool]})
                b=$(median ${before[$k,$tool]})
                tp=$(median ${treep[$k,$tool]})
                op=$(median ${toolp[$k,$tool]})
            fi
            [[ $tool == trapline && $TRAPLINE_OK == 0 ]] && name="trapline (not available)"
            [[ $tool == heaptrack ]] && name=$(heaptrack_version)
            printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$k" "$name" "$(fmt %.0f "$b")" "$(fmt %.0f "$a")" \
                "$(fmt %.1f "$(calc "($a - $nat) * 1024 / $k")")" "$(fmt %.0f "$op")" "$(fmt %.0f "$tp")"
        done
    done
    echo
    echo "Target: trapline at most 32 bytes per live allocation (its per-thread buffers included)."
    ((TRAPLINE_OK)) || echo "trapline column pending: $TRAPLINE_WHY"
}

# ---------------------------------------------------------------- main

ensure_tools
build
check_trapline
echo "## trapline benchmarks ($(date -u +%Y-%m-%dT%H:%MZ), $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo
machine_line
echo
TRAPLINE_ID=$(agent_identity)
dirty=""
[[ -n $(cd "$ROOT" && git status --porcelain -- crates 2>/dev/null) ]] && dirty=" (crates/ has uncommitted changes)"
echo "trapline: $TRAPLINE_ID$dirty; run as \`trapline run ${TRAPLINE_ARGS:-}${TRAPLINE_ARGS:+ }-o TRACE -- CMD\`"
echo
echo "Tools: $(heaptrack_version); $(valgrind --version 2>/dev/null || echo 'valgrind ?'); $(gcc --version | sed -n 1p)"
case $WHAT in
    micro) bench_micro ;;
    threads) bench_threads ;;
    spawn) bench_spawn ;;
    cc1) bench_cc1 ;;
    memory) bench_memory ;;
    scan) NO_BUILD=1 TRAPLINE=$TRAPLINE "$BENCH_DIR/scan.sh" ;;
    profile) fetch_sqlite && SQLITE_C=$SQLITE_C NO_BUILD=1 TRAPLINE=$TRAPLINE "$BENCH_DIR/profile.sh" ;;
    all)
        bench_micro
        bench_threads
        bench_spawn
        bench_memory
        bench_cc1
        NO_BUILD=1 "$BENCH_DIR/locks.sh"
        fetch_sqlite && SQLITE_C=$SQLITE_C NO_BUILD=1 TRAPLINE=$TRAPLINE "$BENCH_DIR/profile.sh"
        ;;
esac
if ((TRAPLINE_OK)) && [[ $(agent_identity) != "$TRAPLINE_ID" ]]; then
    echo
    echo "WARNING: the trapline agent was rebuilt during this run (now $(agent_identity)); its columns mix builds."
fi
