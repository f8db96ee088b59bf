#!/usr/bin/env bash
# Issue 54's latency target: p50 and p99 of health/check at CONNS connections
# (64 by default) against the C epoll echo, SwiftNIO's floor (FLOOR_BIN's
# `echo-server --raw`, optional) and two threadwire builds, all on the shared
# cores (no pinning), ROUNDS rounds of DUR seconds, one line per server and
# round: "connections round server req/s p50_µs p99_µs".
#   A_BIN=/path/to/old/threadwire-server B_BIN=.build/release/threadwire-server \
#     FLOOR_BIN=…/ThreadwireBench Benchmarks/p99.sh
set -euo pipefail
A_BIN=${A_BIN:?the threadwire-server binary of build A}
B_BIN=${B_BIN:-.build/release/threadwire-server}
DUR=${DUR:-3}
source Benchmarks/c_load.sh
.build/c/epoll_echo 7691 > "$data/echo.out" & pids+=($!)
"$A_BIN" --listen 127.0.0.1:7692 --data-dir "$data/a" --log-level error > "$data/a.out" 2>&1 & pids+=($!)
"$B_BIN" --listen 127.0.0.1:7693 --data-dir "$data/b" --log-level error > "$data/b.out" 2>&1 & pids+=($!)
servers=("echo 7691" "A 7692" "B 7693")
if [ -n "${FLOOR_BIN:-}" ]; then
  "$FLOOR_BIN" echo-server --raw --port 7694 > "$data/floor.out" & pids+=($!)
  listening floor.out
  servers=("echo 7691" "floor 7694" "A 7692" "B 7693")
fi
listening echo.out a.out b.out
for c in ${CONNS:-64}; do
  for round in $(seq "${ROUNDS:-3}"); do
    for server in "${servers[@]}"; do
      set -- $server
      out=$(load "$2" "$c" "$DUR" "$HEALTH")
      echo "$c $round $1 $("$PY" -c "import json,sys; r=json.loads(sys.argv[1]); print(int(r['requests_per_second']), r['p50_us'], r['p99_us'])" "$out")"
    done
  done
done
