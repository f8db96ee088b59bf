#!/usr/bin/env bash
# Issue 12: the PostgreSQL store against SQLite on the same workloads, and
# against PostgreSQL's own ceiling for the same kind of row change.
#   - a throwaway PostgreSQL cluster (initdb as the postgres user, fsync on,
#     synchronous_commit on: the same durability promise as SQLite FULL);
#   - the release server on SQLite, then on PostgreSQL, each loaded by the
#     release CLI's closed-loop generator: settings (thread/settings/update,
#     one durable commit each) and turn (turn/start to turn/completed);
#   - pgbench with a custom script: one UPDATE of one row of a 64-column-free
#     table per transaction, as many clients as connections: the most durable
#     single-row transactions PostgreSQL does here.
# Medians of RUNS runs of SECONDS_PER_RUN s. Usage: Benchmarks/postgres.sh (make bench-postgres)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${SERVER_BIN:-$root/.build/release/threadwire-server}
cli_bin=${CLI_BIN:-$root/.build/release/threadwire}
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-5}
. "$root/Benchmarks/pg-cluster.sh"

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

start_server() {  # name, flags...
  local name=$1; shift
  "$server_bin" --listen 127.0.0.1:0 --data-dir "$work/data-$name" --log-level error "$@" > "$work/$name.out" &
  server_pid=$!
  for _ in $(seq 150); do grep -q "listening on" "$work/$name.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "listening on" "$work/$name.out" || { echo "server $name did not start" >&2; exit 1; }
  port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$work/$name.out" | head -1)
}

measure() {  # workload connections -> "rps p50 p99"
  local workload=$1 connections=$2
  for _ in $(seq "$runs"); do
    "$cli_bin" bench --server "127.0.0.1:$port" --workload "$workload" --connections "$connections" --duration "$seconds" --json |
      python3 -c 'import json,sys; r=json.load(sys.stdin); print(int(r["throughput_per_second"]), r["latency_us"]["p50"], r["latency_us"]["p99"])'
  done | sort -n | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'
}

declare -A result
for store in sqlite postgres; do
  if [ $store = sqlite ]; then start_server sqlite; else start_server postgres --store "postgres://threadwire@127.0.0.1:$pgport/tw"; fi
  for workload in settings turn; do
    for connections in 1 16; do
      result[$store,$workload,$connections]=$(measure $workload $connections)
    done
  done
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
done

# PostgreSQL's own ceiling for durable single-row updates.
"$pgbin/psql" -q -h 127.0.0.1 -p "$pgport" -U threadwire -d tw -c \
  "CREATE TABLE bench_rows (id INT PRIMARY KEY, v BIGINT NOT NULL); INSERT INTO bench_rows SELECT g, 0 FROM generate_series(1, 10000) g;"
printf '\\set id random(1, 10000)\nUPDATE bench_rows SET v = v + 1 WHERE id = :id;\n' > "$work/update.sql"
declare -A ceiling
for connections in 1 16; do
  ceiling[$connections]=$(for _ in $(seq "$runs"); do
    "$pgbin/pgbench" -n -h 127.0.0.1 -p "$pgport" -U threadwire -c "$connections" -j "$connections" -T "$seconds" -f "$work/update.sql" tw 2>/dev/null |
      sed -n 's/^tps = \([0-9.]*\).*/\1/p' | cut -d. -f1
  done | median)
done

printf '\n| workload | connections | SQLite req/s (p50 / p99 µs) | PostgreSQL req/s (p50 / p99 µs) | PostgreSQL vs SQLite |\n|---|---|---|---|---|\n'
for workload in settings turn; do
  for connections in 1 16; do
    read -r s_rps s_p50 s_p99 <<< "${result[sqlite,$workload,$connections]}"
    read -r p_rps p_p50 p_p99 <<< "${result[postgres,$workload,$connections]}"
    echo "| $workload | $connections | $s_rps ($s_p50 / $s_p99) | $p_rps ($p_p50 / $p_p99) | $(python3 -c "print(f'{$p_rps/$s_rps*100:.0f} %')") |"
  done
done
printf '\n| pgbench one-row UPDATE transactions | connections | tps | threadwire settings/update on PostgreSQL vs it |\n|---|---|---|---|\n'
for connections in 1 16; do
  read -r p_rps _ _ <<< "${result[postgres,settings,$connections]}"
  echo "| pgbench | $connections | ${ceiling[$connections]} | $(python3 -c "print(f'{$p_rps/${ceiling[$connections]}*100:.0f} %')") |"
done
