#!/usr/bin/env bash
# Issue 49: the server's pwrite64, fdatasync and pread64 calls per request
# over 5 s of a workload (perf's syscall tracepoints; needs root).
# Usage: Benchmarks/sqlite-turn-io/syscount.sh SERVER_BIN [turn|settings]
set -euo pipefail
. "$(dirname "$0")/common.sh"
workload=${2:-turn}
start_warm "$1" "$workload"
perf stat -e 'syscalls:sys_enter_pwrite64,syscalls:sys_enter_fdatasync,syscalls:sys_enter_pread64' \
  -p "$pid" -o "$out/syscount.stat" -- sleep 5 > /dev/null 2>&1 &
perf_pid=$!
rps=$(bench_rps "$workload" 5)
wait $perf_pid
kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
awk -v n="$(python3 -c "print($rps * 5)")" '/syscalls/ {gsub(",", "", $1); printf "%-32s %8.2f per request\n", $2, $1 / n}' "$out/syscount.stat"
