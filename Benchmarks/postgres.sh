#!/usr/bin/env bash
# Issue 12: the PostgreSQL store against SQLite on the same workloads, and
# against PostgreSQL's own ceiling for the same kind of row change.
#   - a throwaway PostgreSQL cluster (initdb as the postgres user, fsync on,
#     synchronous_commit on: the same durability promise as SQLite FULL);
#   - the release server on SQLite, then on PostgreSQL, each loaded by the
#     release CLI's closed-loop generator: settings (thread/settings/update,
#     one durable commit each) and turn (turn/start to turn/completed);
#   - pgbench (prepared, as many clients as connections) with two scripts:
#     one UPDATE of a minimal two-column row per transaction (the most durable
#     single-row transactions PostgreSQL does here), and the same change
#     threadwire's settings update makes (a threads row with its 8 indexes,
#     the lease row locked FOR SHARE): PostgreSQL's ceiling for the same rows.
# Medians of RUNS runs of SECONDS_PER_RUN s. Usage: Benchmarks/postgres.sh (make bench-postgres)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${SERVER_BIN:-$root/.build/release/threadwire-server}
cli_bin=${CLI_BIN:-$root/.build/release/threadwire}
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-5}
. "$root/Benchmarks/pg-cluster.sh"

. "$root/Benchmarks/cli_load.sh"

# settings/update on PostgreSQL from the independent C generator too: the
# CLI's Swift client adds latency of its own (and its connection hears each
# update as a notification), pgbench hears nothing back.
# Interleaved with pgbench on the very rows each run changed (the server
# stays up, idle, holding their leases at epoch 1, as pgbench's fence wants):
# both then see the same table, indexes and dead tuples, which differ a lot
# between a fresh cluster and one that has taken minutes of updates.
settings_threads_file=$work/settings-threads
. "$root/Benchmarks/c_settings_load.sh"
# pgbench's update of the rows threadwire's settings/update changes (a threads
# row with its 8 indexes, the lease row locked FOR SHARE as a fenced commit
# does; updated_at set to the time in ms, as threadwire sets it).
cat > "$work/same-rows.sql" <<'SQL'
\set n :client_id + 1
WITH b AS (SELECT id, session_id FROM bench_ids WHERE n = :n),
     fence AS (SELECT 1 FROM thread_leases l, b WHERE l.tree = b.session_id AND l.epoch = 1 FOR SHARE OF l)
UPDATE threads t SET session_id = t.session_id, parent_id = t.parent_id, forked_from_id = t.forked_from_id,
    source = t.source, depth = t.depth, task_name = t.task_name, nickname = t.nickname, preview = t.preview,
    name = t.name, created_at = t.created_at, updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint, archived = t.archived,
    runtime = t.runtime, legacy = t.legacy, selected_mode = t.selected_mode, model = t.model, cwd = t.cwd,
    base_instructions = t.base_instructions, config_overrides = t.config_overrides, version = t.version + 1,
    agent_status = t.agent_status, agent_final_message = t.agent_final_message, agent_closed = t.agent_closed
FROM b WHERE t.id = b.id AND EXISTS (SELECT 1 FROM fence);
SQL
same_rows_pgbench() {  # connections run -> "tps p50" of pgbench's same-row script on the last run's rows
  local connections=$1 run=$2
  PGOPTIONS="-c client_min_messages=warning" "$pgbin/psql" -q -h 127.0.0.1 -p "$pgport" -U threadwire -d tw -v ON_ERROR_STOP=1 -c "DROP TABLE IF EXISTS bench_ids;
      CREATE TABLE bench_ids (n BIGINT, id TEXT, session_id TEXT);" > /dev/null
  awk '{print NR "," $1}' "$settings_threads_file" |
    "$pgbin/psql" -q -h 127.0.0.1 -p "$pgport" -U threadwire -d tw -v ON_ERROR_STOP=1 -c "\\copy bench_ids (n, id) FROM STDIN WITH (FORMAT csv)" > /dev/null
  "$pgbin/psql" -q -h 127.0.0.1 -p "$pgport" -U threadwire -d tw -v ON_ERROR_STOP=1 -c "UPDATE bench_ids b SET session_id = t.session_id FROM threads t WHERE t.id = b.id;" > /dev/null
  local tps
  tps=$(cd "$work" && "$pgbin/pgbench" -n -M prepared -h 127.0.0.1 -p "$pgport" -U threadwire -c "$connections" -j "$connections" -T "$seconds" \
    --log --log-prefix="lat-interleaved-$connections-$run" -f "$work/same-rows.sql" tw 2>/dev/null | sed -n 's/^tps = \([0-9]*\).*/\1/p')
  [ -n "$tps" ] || { echo "pgbench did not run on the rows of the last settings run" >&2; return 1; }
  # Every transaction's latency (µs, third field of the log): its median is the p50.
  echo "$tps $(cat "$work"/lat-interleaved-$connections-$run.* | awk '{print $3}' | median)"
}
# Each run of either starts on vacuumed tables (pgbench vacuums its own
# tables before a run unless told not to): the thousands of dead versions
# of a few rows that a run leaves, and their index entries at the right edge
# of the updated_at indexes, slowed the next run 2-5x until autovacuum came.
vacuum_tables() { "$pgbin/psql" -q -h 127.0.0.1 -p "$pgport" -U threadwire -d tw -c "VACUUM threads, thread_leases" > /dev/null; }
measure_c() {  # connections -> "rps p50 p99 tps p50": threadwire's run and pgbench's after it, the pair with the median ratio
  for run in $(seq "$runs"); do
    vacuum_tables
    local threadwire; threadwire=$(load_settings_c "$1")
    vacuum_tables
    echo "$threadwire $(same_rows_pgbench "$1" "$run")"
  done | awk '{print $1 / $4, $0}' | sort -n | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}' | cut -d' ' -f2-
}

declare -A result
for store in sqlite postgres; do
  if [ $store = sqlite ]; then start_server sqlite; else start_server postgres --store "postgres://threadwire@127.0.0.1:$pgport/tw"; fi
  for workload in settings turn; do
    for connections in 1 16; do
      result[$store,$workload,$connections]=$(measure $workload $connections)
    done
  done
  if [ $store = postgres ]; then
    for connections in 1 16; do result[c,$connections]=$(measure_c $connections); done
  fi
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
done

# PostgreSQL's own ceilings: durable one-row updates of a minimal table, and
# of the same rows threadwire writes (a threads row with its 8 indexes, one
# row per client, with the lease row locked FOR SHARE as a fenced commit
# does), prepared, as many clients as connections.
psql_tw() { "$pgbin/psql" -q -h 127.0.0.1 -p "$pgport" -U threadwire -d tw "$@"; }
psql_tw -c "CREATE TABLE bench_rows (id INT PRIMARY KEY, v BIGINT NOT NULL); INSERT INTO bench_rows SELECT g, 0 FROM generate_series(1, 10000) g;"
psql_tw -c "DROP TABLE IF EXISTS bench_ids; CREATE TABLE bench_ids AS SELECT row_number() OVER (ORDER BY id) AS n, id, session_id FROM threads;
            INSERT INTO thread_leases SELECT session_id, 'pgbench', '-', 1, now() + interval '1 day' FROM bench_ids
            ON CONFLICT (tree) DO UPDATE SET epoch = 1, expires_at = EXCLUDED.expires_at;"
printf '\\set id random(1, 10000)\nUPDATE bench_rows SET v = v + 1 WHERE id = :id;\n' > "$work/minimal.sql"
declare -A ceiling
for script in minimal same-rows; do
  for connections in 1 16; do
    ceiling[$script,$connections]=$(for run in $(seq "$runs"); do
      (cd "$work" && "$pgbin/pgbench" -n -M prepared -h 127.0.0.1 -p "$pgport" -U threadwire -c "$connections" -j "$connections" -T "$seconds" \
        -f "$work/$script.sql" tw 2>/dev/null) |
        sed -n 's/^tps = \([0-9.]*\).*/\1/p' | cut -d. -f1
    done | median)
  done
done

printf '\n| workload | connections | SQLite req/s (p50 / p99 µs) | PostgreSQL req/s (p50 / p99 µs) | PostgreSQL vs SQLite |\n|---|---|---|---|---|\n'
for workload in settings turn; do
  for connections in 1 16; do
    read -r s_rps s_p50 s_p99 <<< "${result[sqlite,$workload,$connections]}"
    read -r p_rps p_p50 p_p99 <<< "${result[postgres,$workload,$connections]}"
    echo "| $workload | $connections | $s_rps ($s_p50 / $s_p99) | $p_rps ($p_p50 / $p_p99) | $(python3 -c "print(f'{$p_rps/$s_rps*100:.0f} %')") |"
  done
done
printf '\n| connections | pgbench minimal row tps | pgbench same rows tps | threadwire settings/update on PostgreSQL | vs minimal | vs same rows |\n|---|---|---|---|---|---|\n'
for connections in 1 16; do
  read -r p_rps _ _ <<< "${result[postgres,settings,$connections]}"
  minimal=${ceiling[minimal,$connections]}; same=${ceiling[same-rows,$connections]}
  echo "| $connections | $minimal | $same | $p_rps | $(python3 -c "print(f'{$p_rps/$minimal*100:.0f} %')") | $(python3 -c "print(f'{$p_rps/$same*100:.0f} %')") |"
done
printf '\n| connections | pgbench on the same rows, right after, tps (p50 µs) | threadwire settings/update on PostgreSQL, C generator, req/s (p50 / p99 µs) | throughput vs same rows | p50 vs same rows |\n|---|---|---|---|---|\n'
for connections in 1 16; do
  read -r c_rps c_p50 c_p99 same same_p50 <<< "${result[c,$connections]}"
  echo "| $connections | $same ($same_p50) | $c_rps ($c_p50 / $c_p99) | $(python3 -c "print(f'{$c_rps/$same*100:.0f} %')") | $(python3 -c "print(f'{$c_p50/$same_p50:.2f}×')") |"
done
