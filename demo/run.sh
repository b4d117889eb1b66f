#!/usr/bin/env bash
# Builds trapline, records the demo service and shows its leak report.
# Usage: bash demo/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in gcc libc6-dev libc6-dbg; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi

cargo build --release --quiet
mkdir -p target/demo
gcc -g -O0 -pthread demo/leaky_service.c -o target/demo/leaky_service

echo "== trapline run --profile -o target/demo/leaky_service.trace -- target/demo/leaky_service"
target/release/trapline run --profile -o target/demo/leaky_service.trace -- target/demo/leaky_service
echo
echo "== trapline leaks target/demo/leaky_service.trace"
target/release/trapline leaks target/demo/leaky_service.trace
echo
echo "== trapline report target/demo/leaky_service.trace -o target/demo/report.html"
target/release/trapline report --force target/demo/leaky_service.trace -o target/demo/report.html
echo "open target/demo/report.html in a browser (heap over time, leaks, flame graphs, locks)"
