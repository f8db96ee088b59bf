#!/usr/bin/env bash
# Issue 49: builds side by side after a warm-up. Each round starts each
# binary on a fresh store and, for settings then turn, runs 2 s of the
# workload, then measures 4 s: req/s and the server's CPU per request.
# Usage: ROUNDS=3 Benchmarks/sqlite-turn-io/warm-ab.sh BIN_A BIN_B ...
set -euo pipefail
. "$(dirname "$0")/common.sh"
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
for round in $(seq "${ROUNDS:-3}"); do
  for bin in "$@"; do
    start_warm "$bin" settings
    for workload in settings turn; do
      [ $workload = turn ] && "$cli" bench --server "127.0.0.1:$port" --workload turn --connections 16 --duration 2 --json > /dev/null
      t0=$(ticks); rps=$(bench_rps $workload 4); t1=$(ticks)
      echo "$bin $workload round $round: $(python3 -c "print(round($rps), 'req/s', round(($t1 - $t0) / $hz * 1e6 / ($rps * 4), 1), 'CPU µs/request')")"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
  done
done
