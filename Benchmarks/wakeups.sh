#!/usr/bin/env bash
# Issue 54: where threadwire's extra system time per request goes. Each
# server on CPU 0 (threadwire and SwiftNIO's floor with one event loop), the
# C generator on CPU 1, health/check at CONNS connections: the server's user
# and system CPU per request (from /proc) beside the interrupts that woke
# the generator's CPU per request (/proc/interrupts: RES, rescheduling;
# CAL, function calls: the wake-ups one CPU sends another). A server's write
# that wakes a client on an idle CPU pays that CPU's wake-up in its own
# system time; a server slower than its client leaves the client's CPU idle
# more often, so it pays more of them per request.
#   SERVER_BIN=.build/release/threadwire-server FLOOR_BIN=Benchmarks/.build/release/ThreadwireBench Benchmarks/wakeups.sh
set -euo pipefail
SERVER_BIN=${SERVER_BIN:-.build/release/threadwire-server}
FLOOR_BIN=${FLOOR_BIN:-Benchmarks/.build/release/ThreadwireBench}
CONNS=${CONNS:-16}
DUR=${DUR:-3}
ROUNDS=${ROUNDS:-2}
source Benchmarks/c_load.sh
[ "$(nproc)" -ge 2 ] || { echo "needs two CPUs: the server on one, the generator on the other" >&2; exit 1; }
taskset -c 0 .build/c/epoll_echo 7711 > "$data/echo.out" &
echo_pid=$!; pids+=($echo_pid)
taskset -c 0 "$FLOOR_BIN" echo-server --raw --port 7712 --event-loops 1 > "$data/floor.out" &
floor_pid=$!; pids+=($floor_pid)
taskset -c 0 "$SERVER_BIN" --event-loops 1 --listen 127.0.0.1:7713 --data-dir "$data/store" --log-level error > "$data/tw.out" 2>&1 &
tw_pid=$!; pids+=($tw_pid)
listening echo.out floor.out tw.out
# CPU 1's count of each kind of interrupt, as "RES CAL".
woken() { awk '$1 == "RES:" {res = $3} $1 == "CAL:" {cal = $3} END {print res, cal}' /proc/interrupts; }
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
printf "server\tround\treq/s\tuser µs/request\tsystem µs/request\tgenerator CPU woken per request: RES + CAL = total\n"
for round in $(seq "$ROUNDS"); do
  for server in "C echo:$echo_pid:7711" "NIO floor:$floor_pid:7712" "threadwire:$tw_pid:7713"; do
    IFS=: read -r name pid port <<< "$server"
    taskset -c 1 .build/c/frame_load "$port" "$CONNS" 1 "$HEALTH" > /dev/null  # warm up
    read -r u0 s0 < <(ticks "$pid"); read -r res0 cal0 < <(woken)
    out=$(taskset -c 1 .build/c/frame_load "$port" "$CONNS" "$DUR" "$HEALTH")
    read -r res1 cal1 < <(woken); read -r u1 s1 < <(ticks "$pid")
    "$PY" -c "
rps = $(field "$out" requests_per_second); n = rps * $DUR; tick = 1e6 / $(getconf CLK_TCK)
res, cal = ($res1 - $res0) / n, ($cal1 - $cal0) / n
print('$name\t$round\t%d\t%.2f\t%.2f\t%.3f + %.3f = %.3f' % (rps, ($u1 - $u0) * tick / n, ($s1 - $s0) * tick / n, res, cal, res + cal))"
  done
done
