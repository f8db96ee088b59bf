#!/usr/bin/env bash
# Issue 54: what a request costs the server in the kernel's own counts, at 16
# and at 64 connections: CPU (user, system), system calls, context switches,
# cycles and instructions per request (perf stat on the server's process over
# one run of the C generator), for the C epoll echo and threadwire's
# health/check and thread/read. Where CPU per request grows with connections,
# these say whether it is more calls, more switches or slower instructions.
# Usage: Benchmarks/per_request.sh   (SERVER_BIN=… for another build; make bench-per-request)
set -euo pipefail
BIN=${BIN:-.build/release}
DUR=${DUR:-3}
source Benchmarks/c_load.sh
.build/c/epoll_echo 7601 > "$data/echo.out" &
pids+=($!); echo_pid=$!
"${SERVER_BIN:-$BIN/threadwire-server}" --listen 127.0.0.1:7602 --data-dir "$data/store" --log-level error > "$data/tw.out" 2>&1 &
pids+=($!); tw_pid=$!
listening tw.out echo.out
THREAD=$("$BIN/threadwire" call --server 127.0.0.1:7602 thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])")
READ=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$THREAD'")
events=task-clock,context-switches,cpu-migrations,raw_syscalls:sys_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_writev
counted() { # label pid port connections frame [setup frame]
  local label=$1 pid=$2 port=$3 c=$4 hex=$5 setup=${6:-} out
  load "$port" "$c" 1 "$hex" $setup > /dev/null  # warm up
  perf stat -x, -e "$events" -p "$pid" -o "$data/stat" -- sleep "$DUR" &
  local perf_pid=$!
  out=$(load "$port" "$c" "$DUR" "$hex" $setup)
  wait $perf_pid
  "$PY" - "$label" "$c" "$out" "$data/stat" "$DUR" "/proc/$pid" <<'PYEOF'
import json, sys
label, c, out, stat, dur = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], float(sys.argv[5])
n = out["requests_per_second"] * dur
counts = {}
for line in open(stat):
    parts = line.strip().split(",")
    if len(parts) > 2 and parts[0] and parts[0][0].isdigit():
        counts[parts[2]] = float(parts[0])
def per(name, scale=1.0):
    v = counts.get(name)
    return "-" if v is None else f"{v / n * scale:.2f}"
print(f"| {label} | {c} | {out['requests_per_second']:.0f} | {per('task-clock', 1e3)} | {per('raw_syscalls:sys_enter')} "
      f"| {per('syscalls:sys_enter_epoll_wait')} | {per('syscalls:sys_enter_read')} | {per('syscalls:sys_enter_write')} + {per('syscalls:sys_enter_writev')} "
      f"| {per('context-switches')} | {per('cpu-migrations')} |")
PYEOF
}
echo "| server | connections | req/s | CPU µs/request | system calls/request | epoll_wait | read | write + writev | context switches/request | migrations/request |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for round in $(seq "${ROUNDS:-1}"); do
  for c in 16 64; do
    counted "C echo" "$echo_pid" 7601 "$c" "$HEALTH"
    counted "health/check" "$tw_pid" 7602 "$c" "$HEALTH"
    counted "thread/read" "$tw_pid" 7602 "$c" "$READ" "$INIT"
  done
done
