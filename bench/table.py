#!/usr/bin/env python3
"""Print a short markdown table of bench/results.jsonl.

One line per workload: the most recent run of that workload (by date, time
and commit), with each tool's headline figure. `--all` prints one line per
row instead. Standard library only.

    python3 bench/table.py > bench/RESULTS.md
"""

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).with_name("results.jsonl")

# Headline figures, in order of preference, and how to print them.
FIGURES = [
    ("ratio_to_native", lambda v: f"{v:g}x"),
    ("throughput_ratio", lambda v: f"{v:g}x native throughput"),
    ("ns_added_per_pair", lambda v: f"+{v:g} ns/pair"),
    ("us_added_per_pair", lambda v: f"+{v:g} us/pair"),
    ("us_added_per_thread", lambda v: f"+{v:g} us/thread"),
    ("bytes_added_per_live_block", lambda v: f"{v:g} B/live block"),
    ("pause_ms_median", lambda v: f"{v:g} ms pause"),
    ("thread_cpu_ratio_to_native", lambda v: f"{v:.3f}x thread CPU"),
    ("loop_ns_per_pair", lambda v: f"{v:g} ns/pair"),
    ("ns_per_pair", lambda v: f"{v:g} ns/pair"),
    ("median_s", lambda v: f"{v:g} s"),
    ("loop_s_median", lambda v: f"{v:g} s"),
    ("wall_s_median", lambda v: f"{v:g} s"),
    ("scan_bytes_per_block", lambda v: f"{v:g} B/block for the scan"),
    ("max_threads_approx", lambda v: f"about {v:,} threads"),
    ("changed_capture_tsc_cycles", lambda v: f"{v:g} cycles/changed capture"),
    ("agent_instructions_per_event", lambda v: f"{v:g} agent instr./event"),
    ("wall_s_approx", lambda v: f"about {v:g} s"),
]


def headline(row):
    for key, fmt in FIGURES:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            text = fmt(value)
            if key == "ratio_to_native" and isinstance(row.get("median_s"), (int, float)):
                text = f"{row['median_s']:g} s, {text}"
            if key == "throughput_ratio" and isinstance(row.get("requests_per_s_median"), (int, float)):
                text = f"{row['requests_per_s_median']:,} req/s, {text}"
            return text
    return None


# Fields that tell apart rows of one run and tool.
VARIANTS = [("threads", "{} threads"), ("live_blocks", "{:,} blocks")]


def label(row, with_commit):
    parts = [fmt.format(row[key]) for key, fmt in VARIANTS if key in row]
    if with_commit and row.get("commit"):
        parts.append(row["commit"])
    return row["tool"] + (f" ({', '.join(parts)})" if parts else "")


def run_key(row):
    return (row.get("date") or "", row.get("time_utc") or "", row.get("commit") or "")


def cell(text):
    return str(text).replace("|", "\\|")


def load():
    rows = []
    with RESULTS.open() as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{RESULTS}:{number}: {e}")
    return rows


def summary(rows):
    by_workload = {}
    for row in rows:
        by_workload.setdefault(row["workload"], []).append(row)
    print("| workload | latest run | cpu | figures |")
    print("|---|---|---|---|")
    for workload in sorted(by_workload):
        group = by_workload[workload]
        latest = max(run_key(r)[:2] for r in group)
        runs = [r for r in group if run_key(r)[:2] == latest]
        several_commits = len({r.get("commit") for r in runs}) > 1
        figures = []
        for r in runs:
            h = headline(r)
            if h is not None:
                figures.append(f"{label(r, several_commits)}: {h}")
        if not figures:
            continue
        first = runs[0]
        when = " ".join(x for x in (first.get("date"), first.get("time_utc")) if x) or "undated"
        commits = sorted({r["commit"] for r in runs if r.get("commit")})
        if commits:
            when += " (" + ", ".join(commits) + ")"
        print(f"| {cell(workload)} | {cell(when)} | {cell(first.get('cpu') or '?')} | {cell('; '.join(figures))} |")


def every(rows):
    print("| date | commit | cpu | workload | tool | figure |")
    print("|---|---|---|---|---|---|")
    for r in sorted(rows, key=run_key):
        print(
            f"| {cell(r.get('date') or '?')} | {cell(r.get('commit') or '?')} | {cell(r.get('cpu') or '?')} "
            f"| {cell(r['workload'])} | {cell(r['tool'])} | {cell(headline(r) or r.get('note', ''))} |"
        )


def main():
    rows = load()
    all_rows = "--all" in sys.argv[1:]
    command = "python3 bench/table.py" + (" --all" if all_rows else "") + " > bench/RESULTS.md"
    print("# Benchmark results")
    print()
    print(f"Generated from `bench/results.jsonl` by `{command}`;")
    print("do not edit by hand. " + ("One line per row of the results file."
          if all_rows else "Each line is the latest run of a workload, with each tool's headline figure."))
    print("Every run, with all its figures (units in the field names), is a row of")
    print("`results.jsonl`; `bench/README.md` says how each benchmark is run. Compare")
    print("figures of one run only: the machines' speed drifts between hours, and the")
    print("AMD EPYC and Intel Xeon machines differ.")
    print()
    (every if all_rows else summary)(rows)


if __name__ == "__main__":
    main()
