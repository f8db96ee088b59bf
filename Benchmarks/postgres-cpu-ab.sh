#!/usr/bin/env bash
# A/B of two server builds' PostgreSQL path, interleaved on one throwaway
# cluster: settings/update from the independent C generator (one thread per
# connection, see c_settings_load.sh) at CONNECTIONS connections, with the
# server's and PostgreSQL's backends' CPU per request from /proc. Usage:
#   BASE_BIN=/path/to/baseline/release Benchmarks/postgres-cpu-ab.sh
# where BASE_BIN holds a threadwire-server built from the baseline commit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${SECONDS_PER_RUN:-4}
connections=${CONNECTIONS:-16}
. "$root/Benchmarks/pg-ab.sh"
backends_cpu() { for p in $(pgrep -f "postgres: threadwire tw"); do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null; done | awk '{s += $1} END {print s + 0}'; }

printf '| round | build | req/s (p50 / p99 µs) | server CPU µs/req | PostgreSQL CPU µs/req |\n|---|---|---|---|---|\n'
for round in $(seq "${RUNS:-3}"); do
  for build in base new; do
    start_build $build
    (seconds=1; load_settings_c "$connections" > /dev/null)  # warm up
    server_before=$(awk '{print $14 + $15}' "/proc/$pid/stat"); pg_before=$(backends_cpu)
    read -r rps p50 p99 <<< "$(load_settings_c "$connections")"
    server_after=$(awk '{print $14 + $15}' "/proc/$pid/stat"); pg_after=$(backends_cpu)
    python3 -c "
n = $rps * $seconds
print(f'| $round | $build | $rps ($p50 / $p99) | {($server_after - $server_before) / 100 * 1e6 / n:.1f} | {($pg_after - $pg_before) / 100 * 1e6 / n:.1f} |')"
    kill $pid; wait $pid 2>/dev/null || true
  done
done
