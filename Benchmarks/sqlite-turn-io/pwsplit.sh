#!/usr/bin/env bash
# Issue 49: the server's writes and syncs by file descriptor and size over
# 3 s of the turn workload (strace; the WAL's frames are a 24-byte header and
# a page, a spilled statement journal writes 4-byte records and pages).
# Usage: Benchmarks/sqlite-turn-io/pwsplit.sh SERVER_BIN
set -euo pipefail
. "$(dirname "$0")/common.sh"
start_warm "$1" turn
ls -l "/proc/$pid/fd" | awk '/sqlite/ {print $9, $11}'
timeout 4 strace -f -e trace=pwrite64,fdatasync,fsync -p "$pid" -o "$out/pwsplit.strace" > /dev/null 2>&1 &
strace_pid=$!
echo "turns per second under strace: $(bench_rps turn 3)"
wait $strace_pid || true
kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
python3 - "$out/pwsplit.strace" <<'PY'
import collections, re, sys
calls = collections.Counter()
for line in open(sys.argv[1]):
    m = re.search(r'(pwrite64|fdatasync|fsync)\((\d+)', line)
    if not m: continue
    size = re.search(r', (\d+), (\d+)\) = ', line) if m.group(1) == 'pwrite64' else None
    calls[(int(m.group(2)), m.group(1), int(size.group(1)) if size else 0)] += 1
for (fd, call, size), count in sorted(calls.items()):
    print(f'fd {fd:3d} {call:10s} {size:6d} bytes: {count}')
PY
