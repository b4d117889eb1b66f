"""What bench/detour.sh and bench/static.sh share: reading their raw
results (`BUILD TOOL ... loop_s=SECONDS`, one line per run, as
bench/src/threads_pairs.c prints its time) and the fields every row of
bench/results.jsonl starts with. Standard library only."""

import datetime
import os
import re


def read(path):
    """The seconds of every run, by build, then tool, in file order."""
    times = {}
    with open(path) as f:
        for line in f:
            build, tool, rest = line.split(maxsplit=2)
            seconds = float(re.search(r"loop_s=([0-9.]+)", rest).group(1))
            times.setdefault(build, {}).setdefault(tool, []).append(seconds)
    return times


def stamp():
    """Date, time, commit and CPU of a row (COMMIT and CPU from the environment)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "date": now.strftime("%Y-%m-%d"),
        "time_utc": now.strftime("%H:%M"),
        "commit": os.environ["COMMIT"],
        "cpu": os.environ["CPU"],
    }
