"""Rows of bench/results.jsonl from bench/ab.sh's raw results.

    python3 bench/ab_rows.py RESULTS.txt bench/results.jsonl

RESULTS.txt has one line per run: `WORKLOAD TOOL VALUE`, where WORKLOAD is
micro (VALUE in ns per pair), slice or cc1 (VALUE in seconds) and TOOL is
native, old or new. The environment gives OLD and NEW (commits), CPU,
SLICE_END and MICRO_N. Appends one row per workload and tool, with the
median and every value, and prints the medians.
"""

import datetime
import json
import os
import statistics
import sys


def main():
    runs = {}
    with open(sys.argv[1]) as f:
        for line in f:
            workload, tool, value = line.split()
            runs.setdefault((workload, tool), []).append(float(value))
    now = datetime.datetime.now(datetime.timezone.utc)
    names = {
        "micro": "micro: malloc+free pairs at call depth 20 "
        f"(bench/src/depth.c, N={int(os.environ['MICRO_N']):,}), A/B (bench/ab.sh)",
        "slice": f"cc1 slice: first {int(os.environ['SLICE_END']):,} lines of "
        "sqlite3.c under LD_PRELOAD, A/B (bench/ab.sh)",
        "cc1": "cc1: gcc's cc1 -O2 on the whole sqlite3.c under LD_PRELOAD, "
        "A/B (bench/ab.sh)",
    }
    commits = {"native": None, "old": os.environ["OLD"], "new": os.environ["NEW"]}
    rows = []
    for workload in ("micro", "slice", "cc1"):
        native = runs.get((workload, "native"))
        if not native:
            continue
        base = statistics.median(native)
        for tool in ("native", "old", "new"):
            values = runs[(workload, tool)]
            median = statistics.median(values)
            row = {
                "date": now.strftime("%Y-%m-%d"),
                "time_utc": now.strftime("%H:%M"),
                "commit": commits[tool],
                "cpu": os.environ["CPU"],
                "workload": names[workload],
                "tool": "native" if tool == "native" else "trapline",
                "rounds": len(values),
            }
            if workload == "micro":
                row["ns_per_pair"] = round(median, 2)
                if tool != "native":
                    row["ns_added_per_pair"] = round(median - base, 2)
            else:
                row["median_s"] = round(median, 3)
                row["ratio_to_native"] = round(median / base, 3)
            row["values"] = values
            rows.append(row)
    with open(sys.argv[2], "a") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    for row in rows:
        figures = {k: v for k, v in row.items() if k.startswith(("median", "ns_", "ratio"))}
        print(row["workload"].split(":")[0], row["tool"], figures)


if __name__ == "__main__":
    main()
