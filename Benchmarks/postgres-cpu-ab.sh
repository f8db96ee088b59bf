#!/usr/bin/env bash
# A/B of two server builds' PostgreSQL path, interleaved on one throwaway
# cluster: settings/update from the independent C generator (one thread per
# connection, see c_settings_load.sh) at CONNECTIONS connections, with the
# server's and PostgreSQL's backends' CPU per request from /proc. Usage:
#   BASE_BIN=/path/to/baseline/release Benchmarks/postgres-cpu-ab.sh
# where BASE_BIN holds a threadwire-server built from the baseline commit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
base_server=${BASE_BIN:?set BASE_BIN to a directory with the baseline threadwire-server}/threadwire-server
new_server=$root/.build/release/threadwire-server
cli_bin=$root/.build/release/threadwire
seconds=${SECONDS_PER_RUN:-4}
connections=${CONNECTIONS:-16}
. "$root/Benchmarks/pg-cluster.sh"
. "$root/Benchmarks/c_settings_load.sh"
"$pgbin/createdb" -h 127.0.0.1 -p "$pgport" -U threadwire tw_base
backends_cpu() { for p in $(pgrep -f "postgres: threadwire tw"); do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null; done | awk '{s += $1} END {print s + 0}'; }

printf '| round | build | req/s (p50 / p99 µs) | server CPU µs/req | PostgreSQL CPU µs/req |\n|---|---|---|---|---|\n'
for round in $(seq "${RUNS:-3}"); do
  for build in base new; do
    if [ $build = base ]; then bin=$base_server; db=tw_base; else bin=$new_server; db=tw; fi
    "$bin" --listen 127.0.0.1:0 --data-dir "$work/data-$build" --log-level error \
      --store "postgres://threadwire@127.0.0.1:$pgport/$db" > "$work/$build.out" &
    pid=$!
    for _ in $(seq 150); do grep -q "listening on" "$work/$build.out" 2>/dev/null && break; sleep 0.1; done
    port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$work/$build.out" | head -1)
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
