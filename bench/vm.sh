#!/usr/bin/env bash
# What whole-system record and replay costs (`trapline vm`, crates/vm):
# one guest, booted from the initramfs of its own recording, run
#   - natively on the host (the program alone, no guest),
#   - under plain TCG (the same QEMU machine, no -icount, no record),
#   - under plain TCG with -icount (the clock record/replay needs, as
#     crates/vm/src/qemu.rs sets it),
#   - recorded (`trapline vm record`),
#   - replayed without a plugin (QEMU's rr=replay),
#   - replayed by `trapline vm replay` (the plugin, then the conversion),
# interleaved ROUNDS times, for three programs: tests/fixtures/leaks.c (a
# few dozen allocations), bench/src/threads_pairs.c with PAIRS
# malloc+free pairs, and tests/fixtures/vm_kleak_writer.c recorded with
# --kernel-allocs and the kleak module (built here against the kernel's
# headers), whose replay traps the kernel's allocator too, and an idle
# guest (/bin/sleep IDLE: the log's growth per guest second when nothing
# runs). Each replay is also run with `--profile` (the CPU sampler; the
# allocator and pthread traps are always on). KVM is tried once: the row
# says why when the host cannot run a guest under it. Wall seconds of
# each, and each replay's ratio to its record; the recording's size per
# guest second (the guest's uptime at power-off, from its console).
# Appends rows to bench/results.jsonl.
#
#   bench/vm.sh        (release build of this tree)
#
# Knobs (environment): ROUNDS=3, PAIRS=20000, IDLE=20.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
WORK=$BENCH_DIR/work/vm
ROUNDS=${ROUNDS:-3}
PAIRS=${PAIRS:-20000}
IDLE=${IDLE:-20}
rm -rf "$WORK"
mkdir -p "$WORK"

(cd "$ROOT" && cargo build --release -q -p trapline-cli -p trapline-vm-plugin >&2)
TRAPLINE=$ROOT/target/release/trapline
export TRAPLINE_VM_PLUGIN=$ROOT/target/release/libtrapline_vm_plugin.so
QEMU=$(command -v qemu-system-x86_64)
gcc -O2 -g -o "$WORK/leaks" "$ROOT/tests/fixtures/leaks.c"
gcc -O2 -g -pthread -o "$WORK/pairs" "$BENCH_DIR/src/threads_pairs.c"
gcc -O2 -g -o "$WORK/kernel" "$ROOT/tests/fixtures/vm_kleak_writer.c"
ln -sf /bin/sleep "$WORK/idle"
KERNEL_IMAGE=$(ls /boot/vmlinuz-* | sort -V | tail -1)
cp "$ROOT/tests/fixtures/vm_kleak/kleak.c" "$ROOT/tests/fixtures/vm_kleak/Kbuild" "$WORK/"
make -s -C "/lib/modules/${KERNEL_IMAGE#/boot/vmlinuz-}/build" M="$WORK" modules >&2

# The machine `trapline vm` runs (crates/vm/src/qemu.rs), for the runs
# without trapline: the recording's kernel and initramfs, into MACHINE.
machine() {
    local rec=$1
    local kernel
    kernel=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["kernel"])' "$rec/manifest.json")
    kernel_args=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["kernel_args"])' "$rec/manifest.json")
    MACHINE=(-nodefaults -no-user-config -machine pc -smp 1 -m 256 -display none -monitor none
        -no-reboot -kernel "$kernel" -initrd "$rec/initramfs.cpio"
        -append "$kernel_args"
        -serial "file:$WORK/console.out")
    if [ -e "$rec/modules.kallsyms.gz" ]; then
        MACHINE+=(-serial "file:$WORK/symbols.out")
    fi
}

wall() { # prints the wall seconds of a command
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    end=$(date +%s.%N)
    python3 -c "print(round($end - $start, 3))"
}

results=$WORK/results.txt
: >"$results"
declare -A args=([leaks]="" [pairs]="$PAIRS 1" [kernel]="" [idle]="$IDLE")
declare -A record_flags=([leaks]="" [pairs]="" [kernel]="--kernel-allocs --kernel-module $WORK/kleak.ko" [idle]="")
for round in $(seq "$ROUNDS"); do
    for prog in leaks pairs kernel idle; do
        rec=$WORK/rec-$prog-$round
        # shellcheck disable=SC2086
        echo "$prog native $(wall "$WORK/$prog" ${args[$prog]})" >>"$results"
        # shellcheck disable=SC2086
        echo "$prog record $(wall "$TRAPLINE" vm record ${record_flags[$prog]} -o "$rec" -- "$WORK/$prog" ${args[$prog]})" >>"$results"
        machine "$rec"
        echo "$prog tcg $(wall "$QEMU" "${MACHINE[@]}" -accel tcg)" >>"$results"
        grep -q "EXIT 0" "$WORK/console.out"
        echo "$prog tcg_icount $(wall "$QEMU" "${MACHINE[@]}" -accel tcg -icount shift=3,sleep=off)" >>"$results"
        grep -q "EXIT 0" "$WORK/console.out"
        echo "$prog replay $(wall "$QEMU" "${MACHINE[@]}" -accel tcg -icount "shift=3,sleep=off,rr=replay,rrfile=$rec/replay.bin")" >>"$results"
        grep -q "EXIT 0" "$WORK/console.out"
        echo "$prog trapline_replay $(wall "$TRAPLINE" vm replay "$rec" -o "$WORK/$prog.trace")" >>"$results"
        echo "$prog trapline_replay_profile $(wall "$TRAPLINE" vm replay "$rec" --profile -o "$WORK/$prog.profile.trace")" >>"$results"
        uptime=$(tr -d '\r' <"$rec/console.log" | sed -n 's/^\[ *\([0-9.]*\)\].*Power down.*/\1/p' | tail -1)
        bytes=$(stat -c %s "$rec/replay.bin")
        echo "$prog guest_seconds $uptime" >>"$results"
        echo "$prog log_bytes $bytes" >>"$results"
        if [ "$round" -gt 1 ]; then rm -rf "$rec"; fi
    done
    echo "round $round done" >&2
done
# KVM, once: does a guest boot at all?
machine "$WORK/rec-leaks-1"
: >"$WORK/console.out"
if kvm_out=$(timeout 120 "$QEMU" "${MACHINE[@]}" -accel kvm 2>&1) && grep -q "EXIT 0" "$WORK/console.out"; then
    echo "leaks kvm_ok yes" >>"$results"
else
    echo "leaks kvm_error $(echo "$kvm_out" | tr '\n' ' ' | cut -c1-200)" >>"$results"
fi

CPU=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | sed -n 1p)
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
QEMU_VERSION=$("$QEMU" --version | head -1)
CPU=$CPU COMMIT=$COMMIT PAIRS=$PAIRS IDLE=$IDLE QEMU_VERSION=$QEMU_VERSION PYTHONPATH=$BENCH_DIR \
    python3 - "$results" "$ROOT/bench/results.jsonl" <<'PY'
import json, os, statistics, sys
import loop_times
runs, facts = {}, {}
with open(sys.argv[1]) as f:
    for line in f:
        prog, what, value = line.rstrip("\n").split(" ", 2)
        if what in ("guest_seconds", "log_bytes"):
            runs.setdefault(prog, {}).setdefault(what, []).append(float(value))
        elif what.startswith("kvm"):
            facts["kvm"] = value if what == "kvm_error" else "boots"
        else:
            runs.setdefault(prog, {}).setdefault(what, []).append(float(value))
stamp = loop_times.stamp()
pairs = int(os.environ["PAIRS"])
workloads = {
    "leaks": "leaks.c (62 allocations) in a QEMU guest, whole-system record and replay (bench/vm.sh)",
    "pairs": f"threads_pairs.c, {pairs:,} malloc+free pairs, in a QEMU guest, whole-system record and replay (bench/vm.sh)",
    "kernel": "vm_kleak_writer.c and the kleak module in a QEMU guest, recorded with --kernel-allocs (the record includes the boot that dumps the kernel's symbols) (bench/vm.sh)",
    "idle": f"/bin/sleep {os.environ['IDLE']} in a QEMU guest: an idle guest, whole-system record and replay (bench/vm.sh)",
}
names = {
    "native": "native on the host",
    "tcg": "plain TCG boot and run (no -icount)",
    "tcg_icount": "TCG with -icount shift=3,sleep=off, no record",
    "record": "trapline vm record",
    "replay": "QEMU rr=replay, no plugin",
    "trapline_replay": "trapline vm replay (plugin and conversion)",
    "trapline_replay_profile": "trapline vm replay --profile (CPU samples too)",
}
with open(sys.argv[2], "a") as out:
    for prog, workload in workloads.items():
        r = runs[prog]
        base = statistics.median(r["tcg"])
        record = statistics.median(r["record"])
        for key, name in names.items():
            secs = r[key]
            row = {**stamp, "workload": workload, "qemu": os.environ["QEMU_VERSION"],
                   "tool": name, "rounds": len(secs), "seconds": secs,
                   "median_s": round(statistics.median(secs), 3)}
            if key not in ("native", "tcg"):
                row["ratio_to_plain_tcg"] = round(statistics.median(secs) / base, 2)
            if key.startswith("trapline_replay"):
                row["ratio_to_record"] = round(statistics.median(secs) / record, 2)
            if key == "record":
                log = statistics.median(r["log_bytes"])
                guest = statistics.median(r["guest_seconds"])
                row["replay_log_bytes"] = int(log)
                row["guest_seconds"] = guest
                row["log_bytes_per_guest_second"] = int(log / guest)
                row["kvm"] = facts.get("kvm", "not tried")
            out.write(json.dumps(row) + "\n")
            print(prog, name, row["median_s"], row.get("ratio_to_plain_tcg", ""))
PY
