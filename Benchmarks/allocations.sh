#!/usr/bin/env bash
# Issue 54: heap allocations per request, a count that does not move with
# the host's noise. The server (one event loop, CPU 0) serves health/check
# and a loaded thread's thread/read at 16 connections from the C generator
# (CPU 1) while perf counts, through uprobes, its calls of libc's malloc and
# free and of the Swift runtime's swift_allocObject (as root: perf probe).
# The probes slow each call, so the req/s printed here is not a figure.
#   SERVER_BIN=.build/release/threadwire-server CLI=.build/release/threadwire Benchmarks/allocations.sh
set -euo pipefail
SERVER_BIN=${SERVER_BIN:-.build/release/threadwire-server}
CLI=${CLI:-.build/release/threadwire}
DUR=${DUR:-2}
source Benchmarks/c_load.sh
libc=$(ldd "$SERVER_BIN" | awk '$1 ~ /^libc\.so/ {print $3}')
swift_core=$(ldd "$SERVER_BIN" | awk '$1 ~ /^libswiftCore\.so/ {print $3}')
perf probe -q -x "$libc" malloc 2> /dev/null || true
perf probe -q -x "$libc" free 2> /dev/null || true
perf probe -q -x "$swift_core" swift_allocObject 2> /dev/null || true
events=probe_libc:malloc,probe_libc:free,probe_libswiftCore:swift_allocObject
perf stat -e "$events" true > /dev/null 2>&1 || { echo "the uprobes could not be set (perf probe needs root)" >&2; exit 1; }
taskset -c 0 "$SERVER_BIN" --event-loops 1 --listen 127.0.0.1:7721 --data-dir "$data/store" --log-level error > "$data/tw.out" 2>&1 &
pids+=($!); tw_pid=$!
listening tw.out
thread=$("$CLI" call --server 127.0.0.1:7721 thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])")
READ=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$thread'")
printf "method\trequests\tmalloc\tfree\tswift_allocObject (per request)\n"
for method in health/check thread/read; do
  if [ "$method" = health/check ]; then args=("$HEALTH"); else args=("$READ" "$INIT"); fi
  taskset -c 1 .build/c/frame_load 7721 16 1 "${args[@]}" > /dev/null  # warm up
  perf stat -x, -e "$events" -p "$tw_pid" -o "$data/stat" -- sleep "$DUR" &
  perf_pid=$!
  out=$(taskset -c 1 .build/c/frame_load 7721 16 "$DUR" "${args[@]}")
  wait "$perf_pid"
  n=$(( $(field "$out" requests_per_second) * DUR ))
  awk -F, -v n="$n" -v m="$method" '/^[0-9]/ {c[$3] = $1} END {printf "%s\t%d\t%.3f\t%.3f\t%.3f\n", m, n, c["probe_libc:malloc"] / n, c["probe_libc:free"] / n, c["probe_libswiftCore:swift_allocObject"] / n}' "$data/stat"
done
