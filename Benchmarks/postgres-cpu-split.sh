#!/usr/bin/env bash
# Issue 49 on PostgreSQL: where a request's CPU goes, the server's and
# PostgreSQL's (every process of the throwaway cluster, from /proc), per
# request, for one release build: a fresh cluster (fsync on), a 2-second
# warm-up, then RUNS runs of SECONDS_PER_RUN at 16 connections.
# Usage: Benchmarks/postgres-cpu-split.sh SERVER_BIN NAME [settings|turn]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=$1; name=$2; workload=${3:-settings}
cli_bin=${CLI_BIN:-$root/.build/release/threadwire}
seconds=${SECONDS_PER_RUN:-5}; runs=1
. "$root/Benchmarks/pg-cluster.sh"
. "$root/Benchmarks/cli_load.sh"
hz=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
postgres_ticks() {
  local sum=0 t
  for p in $(pgrep -u "$(stat -c %U "$work/pg")"); do t=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0); sum=$((sum + t)); done
  echo "$sum"
}
start_server "$name" --store "postgres://threadwire@127.0.0.1:$pgport/tw"
seconds=2 measure "$workload" 16 > /dev/null
for _ in $(seq "${RUNS:-3}"); do
  s0=$(ticks "$server_pid"); p0=$(postgres_ticks)
  read -r r _ _ <<< "$(measure "$workload" 16)"
  s1=$(ticks "$server_pid"); p1=$(postgres_ticks)
  python3 -c "r, s, hz = $r, $seconds, $hz; print('$name $workload', r, 'req/s; server', round(($s1 - $s0) / hz * 1e6 / (r * s), 1), 'µs/request; PostgreSQL', round(($p1 - $p0) / hz * 1e6 / (r * s), 1), 'µs/request')"
done
kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
