#!/usr/bin/env bash
# Issue 54: heap allocations per request, a count that does not move with
# the host's noise. The server (one event loop, CPU 0) serves health/check
# and a loaded thread's thread/read at 16 connections from the C generator
# (CPU 1) while perf counts, through uprobes, its calls of libc's malloc and
# free and of the Swift runtime's swift_allocObject (as root: perf probe).
# COUNT_RC=1 adds swift_retain and swift_release: reference counting is
# the largest part of the user time threadwire spends above SwiftNIO's floor.
# FLOOR_BIN=.../ThreadwireBench adds the floor's health/check (`echo-server --raw`).
# SITES=DIR (with COUNT_RC=1) also records threadwire's retains and releases
# during thread/read with their call stacks into DIR and prints where they
# are made, per request (Benchmarks/refcount_sites.py).
# CONNS=1: one request per read, so the counts do not move with how many
# frames a read happens to carry (at 16 connections, NIO's calls per read
# are shared by however many frames it carries).
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
if [ "${COUNT_RC:-0}" = 1 ]; then
  perf probe -q -x "$swift_core" swift_retain 2> /dev/null || true
  perf probe -q -x "$swift_core" swift_release 2> /dev/null || true
  events=$events,probe_libswiftCore:swift_retain,probe_libswiftCore:swift_release
fi
perf stat -e "$events" true > /dev/null 2>&1 || { echo "the uprobes could not be set (perf probe needs root)" >&2; exit 1; }
taskset -c 0 "$SERVER_BIN" --event-loops 1 --listen 127.0.0.1:7721 --data-dir "$data/store" --log-level error > "$data/tw.out" 2>&1 &
pids+=($!); tw_pid=$!
listening tw.out
thread=$("$CLI" call --server 127.0.0.1:7721 thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])")
READ=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$thread'")
if [ "${COUNT_RC:-0}" = 1 ]; then
  printf "server\tmethod\trequests\tmalloc\tfree\tswift_allocObject\tswift_retain\tswift_release (per request)\n"
else
  printf "server\tmethod\trequests\tmalloc\tfree\tswift_allocObject (per request)\n"
fi
count() {  # label pid port method args...
  local label=$1 pid=$2 port=$3 method=$4; shift 4
  taskset -c 1 .build/c/frame_load "$port" "${CONNS:-16}" 1 "$@" > /dev/null  # warm up
  perf stat -x, -e "$events" -p "$pid" -o "$data/stat" -- sleep "$DUR" &
  perf_pid=$!
  out=$(taskset -c 1 .build/c/frame_load "$port" "${CONNS:-16}" "$DUR" "$@")
  wait "$perf_pid"
  n=$(( $(field "$out" requests_per_second) * DUR ))
  awk -F, -v n="$n" -v m="$method" -v l="$label" '/^[0-9]/ {c[$3] = $1} END {
    printf "%s\t%s\t%d\t%.3f\t%.3f\t%.3f", l, m, n, c["probe_libc:malloc"] / n, c["probe_libc:free"] / n, c["probe_libswiftCore:swift_allocObject"] / n
    if ("probe_libswiftCore:swift_retain" in c) printf "\t%.2f\t%.2f", c["probe_libswiftCore:swift_retain"] / n, c["probe_libswiftCore:swift_release"] / n
    printf "\n" }' "$data/stat" | tee "$data/counted"
}
count threadwire "$tw_pid" 7721 health/check "$HEALTH"
count threadwire "$tw_pid" 7721 thread/read "$READ" "$INIT"
if [ -n "${SITES:-}" ] && [ "${COUNT_RC:-0}" = 1 ]; then
  mkdir -p "$SITES"
  # Every 7th call, with its stack: the shares are scaled to the counts above.
  perf record -e probe_libswiftCore:swift_retain,probe_libswiftCore:swift_release -c 7 --call-graph dwarf,4096 \
    -p "$tw_pid" -o "$SITES/refcounts.data" -- sleep 1 > /dev/null 2>&1 &
  perf_pid=$!
  taskset -c 1 .build/c/frame_load 7721 "${CONNS:-16}" 1 "$READ" "$INIT" > /dev/null
  wait "$perf_pid"
  read -r retains releases < <(awk -F'\t' '{print $7, $8}' "$data/counted")
  "$PY" Benchmarks/refcount_sites.py "$SITES/refcounts.data" "$retains" "$releases" "${DEPTH:-1}"
fi
if [ -n "${FLOOR_BIN:-}" ]; then
  taskset -c 0 "$FLOOR_BIN" echo-server --raw --port 7722 --event-loops 1 > "$data/floor.out" 2>&1 &
  pids+=($!); floor_pid=$!
  listening floor.out
  count floor "$floor_pid" 7722 health/check "$HEALTH"
fi
