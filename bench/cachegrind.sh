#!/usr/bin/env bash
# The agent's cost on gcc's cc1, counted instead of timed (see bench/README.md,
# "Counted with cachegrind").
#
#   bench/cachegrind.sh [AGENT.so ...]    (default: the built agent)
#
# Runs cc1 on the first part of sqlite3.c (cut at a top-level function, about
# 1.2 s native) natively and with each agent preloaded, under valgrind's
# cachegrind with cache and branch simulation, and prints per run: instructions,
# simulated cache misses, mispredicted branches, and the same for the agent's
# own functions (the writer thread's LZ4 included) and for its three costliest
# functions. The counts are the same from one run to the next, so two agents
# can be compared to a fraction of a percent on a machine whose timings vary by
# 5 to 8% (this VM's). What a count does not show is how the misses and
# mispredictions weigh against instructions on a real core; "cost" weights
# them as a rough guide: instructions + 10 x L1 misses + 100 x last-level
# misses + 15 x mispredicted branches (LL is simulated as 1 MiB, like one
# core's L2).
#
# Knobs (environment):
#   SLICE_FROM=40000     cut after the first top-level function ending past this line
#   SQLITE_C=FILE        the SQLite amalgamation (default: libsqlite3-sys 0.30.1's,
#                        from the cargo registry; bench/run.sh fetches it)
#   TRAPLINE=PATH        the trapline CLI, for its agent (default target/release/trapline)
#   NO_BUILD=1           skip `cargo build --release`
#
# Each run takes about 80 s (valgrind is ~60x slower than native).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/sqlite.sh
. "$BENCH_DIR/sqlite.sh"
WORK=$BENCH_DIR/work/cachegrind
TRAPLINE=${TRAPLINE:-$ROOT/target/release/trapline}
SLICE_FROM=${SLICE_FROM:-40000}

log() { printf '[bench cachegrind] %s\n' "$*" >&2; }

command -v valgrind >/dev/null || { log "valgrind missing: apt-get install valgrind"; exit 1; }
mkdir -p "$WORK"
if [[ -z ${NO_BUILD:-} ]]; then
    (cd "$ROOT" && cargo build --release -q >&2)
fi
if [[ -z ${SQLITE_C:-} ]]; then
    SQLITE_C=$(registry_sqlite_c)
fi
[[ -f ${SQLITE_C:-} ]] || { log "no sqlite3.c (set SQLITE_C, or run bench/run.sh cc1 once)"; exit 1; }

# A slice that compiles on its own, ending after line SLICE_FROM.
SLICE=$WORK/sqlite3-slice.c
end=$(cut_sqlite_slice "$SQLITE_C" "$SLICE" "$SLICE_FROM")
CC1=$(gcc -print-prog-name=cc1)
MULTIARCH=$(gcc -print-multiarch)
log "cc1 on the first $end lines of $SQLITE_C"

agents=("$@")
if [[ ${#agents[@]} -eq 0 ]]; then
    agents=("$(dirname "$TRAPLINE")/libtrapline_agent.so")
fi

# run LABEL AGENT|native: cachegrind's output file for cc1
run() {
    local label=$1 agent=$2 env=()
    rm -f "$WORK/$label".cg.* "$WORK/$label".trace*
    if [[ $agent != native ]]; then
        env=("LD_PRELOAD=$agent" "TRAPLINE_OUTPUT=$WORK/$label.trace")
    fi
    valgrind --tool=cachegrind --cache-sim=yes --branch-sim=yes --LL=1048576,16,64 \
        --trace-children=yes --cachegrind-out-file="$WORK/$label.cg.%p" \
        env "${env[@]}" "$CC1" -quiet -imultiarch "$MULTIARCH" -O2 "$SLICE" -o "$WORK/$label.s" \
        >"$WORK/$label.log" 2>&1
    # env is traced too (briefly): cc1's file is the largest.
    ls -S "$WORK/$label".cg.* | sed -n 1p
}

summarize() {
    python3 - "$@" <<'PY'
import collections, sys
# Event order of cachegrind with --cache-sim=yes --branch-sim=yes.
IR, I1, IL, DR, D1R, DLR, DW, D1W, DLW, BC, BCM, BI, BIM = range(13)
def load(path):
    per_fn = collections.defaultdict(lambda: [0] * 13)
    fn = '?'
    for line in open(path):
        if line.startswith('fn='):
            fn = line[3:].strip()
        elif line[:1].isdigit():
            v = per_fn[fn]
            for i, x in enumerate(line.split()[1:14]):
                v[i] += int(x)
    return per_fn
def l1(v): return v[I1] + v[D1R] + v[D1W]
def ll(v): return v[IL] + v[DLR] + v[DLW]
def bm(v): return v[BCM] + v[BIM]
def cost(v): return v[IR] + 10 * l1(v) + 100 * ll(v) + 15 * bm(v)
def agent(fn): return any(k in fn for k in ('trapline', 'lz4_flex', 'framehop', 'gimli'))
def total(rows):
    rows = list(rows)
    return [sum(v[i] for v in rows) for i in range(13)]
native = None
print('| run | instructions | L1 misses | LL misses | mispredicted | cost | agent instructions | agent cost | costliest agent functions (share of agent cost) |')
print('|---|---:|---:|---:|---:|---:|---:|---:|---|')
for arg in sys.argv[1:]:
    label, path = arg.split('=', 1)
    per_fn = load(path)
    t = total(per_fn.values())
    a = total(v for k, v in per_fn.items() if agent(k))
    top = sorted(((cost(v), k) for k, v in per_fn.items() if agent(k)), reverse=True)[:3]
    tops = '; '.join('%s %.0f%%' % (k.split('::')[-1].split('<')[0][:40], 100 * c / max(cost(a), 1)) for c, k in top)
    g = lambda x: '%.3f G' % (x / 1e9)
    m = lambda x: '%.1f M' % (x / 1e6)
    print('| %s | %s | %s | %s | %s | %s | %s | %s | %s |' % (label, g(t[IR]), m(l1(t)), m(ll(t)), m(bm(t)), g(cost(t)),
          g(a[IR]) if a[IR] else '', g(cost(a)) if a[IR] else '', tops))
PY
}

results=("native=$(run native native)")
i=0
for a in "${agents[@]}"; do
    i=$((i + 1))
    [[ -f $a ]] || { log "no agent at $a"; exit 1; }
    log "agent $i: $a"
    results+=("agent$i=$(run "agent$i" "$a")")
done
summarize "${results[@]}"
