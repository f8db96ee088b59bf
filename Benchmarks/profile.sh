#!/usr/bin/env bash
# Issue 10: where a health/check goes in the release server. Runs the C load
# generator (16 connections, closed loop) against SERVER_BIN while
# `perf record` samples the server with call stacks, then prints the
# server's CPU time per request and its samples by shared object and by symbol.
# PIN=1: the server on CPU 0 with one event loop, the generator on CPU 1, so
# the profile is the server's alone (FREQ sets perf's sampling rate).
# CALLGRAPH=dwarf unwinds through leaf functions such as swift_retain, so a
# retain is charged to its real caller (slower; use a lower FREQ).
# KEEP=DIR keeps perf.data in DIR (which must exist), for
# Benchmarks/profile_parts.py: the user time by part of the request path.
# METHOD=thread/read profiles a loaded thread's thread/read instead of
# health/check (CLI: the threadwire CLI that starts the thread).
# Usage: SERVER_BIN=path/to/threadwire-server Benchmarks/profile.sh   (make bench-profile)
set -euo pipefail
BIN=${BIN:-.build/release}
SERVER_BIN=${SERVER_BIN:-$BIN/threadwire-server}
DUR=${DUR:-4}
CONNS=${CONNS:-16}
PY=${PY:-.build/venv/bin/python}
mkdir -p .build/c
cc -O2 -pthread -o .build/c/frame_load Benchmarks/c/frame_load.c
HEALTH=$("$PY" -c "
from threadwire_client import messages
e = messages.envelope.Envelope(); e.request.id = 1; e.request.health_check.SetInParent()
p = e.SerializeToString(); print((b'\x00' + len(p).to_bytes(4, 'big') + p).hex())")
data=${KEEP:-$(mktemp -d)}
server_cpu=(); generator_cpu=(); loops=()
if [ "${PIN:-0}" = 1 ]; then server_cpu=(taskset -c 0); generator_cpu=(taskset -c 1); loops=(--event-loops 1); fi
"${server_cpu[@]}" "$SERVER_BIN" "${loops[@]}" --listen 127.0.0.1:7593 --data-dir "$data/store" --log-level error > "$data/out" 2>&1 &
pid=$!
cleanup() { kill $pid 2>/dev/null; wait $pid 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$data"; }
trap cleanup EXIT
for _ in $(seq 200); do grep -q listening "$data/out" 2>/dev/null && break; sleep 0.05; done
grep -q listening "$data/out" 2>/dev/null || { echo "a server did not start (port in use?): $(cat "$data/out")" >&2; exit 1; };
FRAME=$HEALTH; SETUP=()
if [ "${METHOD:-health/check}" = thread/read ]; then
  thread=$("${CLI:-$BIN/threadwire}" call --server 127.0.0.1:7593 thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])")
  FRAME=$("$PY" -c "
from threadwire_client import messages
e = messages.envelope.Envelope(); e.request.id = 2; e.request.thread_read.thread_id = '$thread'
p = e.SerializeToString(); print((b'\x00' + len(p).to_bytes(4, 'big') + p).hex())")
  SETUP=($("$PY" -c "
from threadwire_client import messages
e = messages.envelope.Envelope(); e.request.id = 1; e.request.initialize.client_info.name = 'profile'; e.request.initialize.protocol_version = 1
p = e.SerializeToString(); print((b'\x00' + len(p).to_bytes(4, 'big') + p).hex())"))
fi
"${generator_cpu[@]}" .build/c/frame_load 7593 "$CONNS" 1 "$FRAME" "${SETUP[@]}" > /dev/null  # warm up
ticks() { awk '{print $14 + $15}' /proc/$pid/stat; }
before=$(ticks)
perf record -F "${FREQ:-4000}" --call-graph "${CALLGRAPH:-fp}" -p $pid -o "$data/perf.data" -- sleep "$DUR" > /dev/null 2>&1 &
perf_pid=$!
result=$("${generator_cpu[@]}" .build/c/frame_load 7593 "$CONNS" "$DUR" "$FRAME" "${SETUP[@]}")
wait $perf_pid
after=$(ticks)
hz=$(getconf CLK_TCK)
"$PY" -c "
import json, sys
r = json.loads(sys.argv[1]); n = r['requests_per_second'] * $DUR
print(f\"{r['requests_per_second']:.0f} req/s under perf, p50 {r['p50_us']} µs; server CPU {($after - $before) / $hz * 1e6 / n:.1f} µs per request\")" "$result"
echo "--- samples by shared object"
perf report -i "$data/perf.data" --no-children --sort dso 2>/dev/null | grep -E '^ +[0-9]' | head -12
echo "--- top symbols"
perf report -i "$data/perf.data" --no-children --sort symbol 2>/dev/null | grep -E '^ +[0-9]' | head -${TOP:-25} | cut -c1-150
