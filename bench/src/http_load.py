#!/usr/bin/env python3
"""Requests GET / from http://127.0.0.1:PORT/ in a loop for SECONDS, one at
a time, and prints a JSON object: requests answered, by HTTP status, and
failures (no answer). Standard library only.

    http_load.py PORT SECONDS
"""

import http.client
import json
import sys
import time

port, seconds = int(sys.argv[1]), float(sys.argv[2])
statuses, failures = {}, 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/")
        r = c.getresponse()
        r.read()
        statuses[r.status] = statuses.get(r.status, 0) + 1
        c.close()
    except OSError:
        failures += 1
print(json.dumps({"statuses": statuses, "failures": failures, "seconds": seconds}))
