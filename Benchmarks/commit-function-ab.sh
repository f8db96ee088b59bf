#!/usr/bin/env bash
# Issue 49 on PostgreSQL: the commit function (threadwire_commit) of two
# builds, timed inside PostgreSQL alone, in one database, without a server or a
# client on the cores. Each build migrates a database of a throwaway cluster
# (fsync on); its function's body is installed in one database under its own
# name, then ROUNDS rounds alternate them (which goes first alternates too):
# CALLS calls of COMMITS commits each keeping EVENTS events (200-byte
# records), and the same calls to a function that does nothing (the cost of
# building the calls' JSON, to subtract). Prints each round's times.
# Usage: A_BIN=old/threadwire-server B_BIN=new/threadwire-server Benchmarks/commit-function-ab.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${ROUNDS:-6}; calls=${CALLS:-2000}; commits=${COMMITS:-16}; events=${EVENTS:-2}
runs=1
. "$root/Benchmarks/pg-cluster.sh"
. "$root/Benchmarks/cli_load.sh"
psql() { "$pgbin/psql" -h 127.0.0.1 -p "$pgport" -U threadwire -v ON_ERROR_STOP=1 -q "$@"; }
for build in a b; do
  server_bin=${A_BIN:?}; [ $build = b ] && server_bin=${B_BIN:?}
  "$pgbin/createdb" -h 127.0.0.1 -p "$pgport" -U threadwire "m$build"
  start_server "$build" --store "postgres://threadwire@127.0.0.1:$pgport/m$build"
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
  psql "m$build" -Atc "SELECT prosrc FROM pg_proc WHERE proname = 'threadwire_commit' AND pronargs = 2" > "$work/$build.sql"
done
# The database b migrated; a's function beside its own.
{ echo 'CREATE FUNCTION commit_a(batch jsonb, records bytea[]) RETURNS text[] LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$'
  cat "$work/a.sql"; echo '$fn$;'
  echo 'CREATE FUNCTION commit_b(batch jsonb, records bytea[]) RETURNS text[] LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$'
  cat "$work/b.sql"; echo '$fn$;'
  echo 'CREATE FUNCTION commit_none(batch jsonb, records bytea[]) RETURNS text[] LANGUAGE sql AS $$ SELECT ARRAY[]::text[] $$;'
} | psql mb
run() {  # function round -> milliseconds
  psql mb <<SQL | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1
\timing on
DO \$\$ DECLARE b jsonb; recs bytea[]; BEGIN
  recs := array(SELECT decode(repeat('ab', 200), 'hex') FROM generate_series(1, $commits * $events));
  FOR it IN 1..$calls LOOP
    b := (SELECT jsonb_agg(jsonb_build_object('rb', (g - 1) * $events, 'ops', jsonb_build_array(
            jsonb_build_object('k', 'events', 'id', '$1-$2-' || g, 'first', (it - 1) * $events + 1, 'at', 0, 'ri', 0, 'n', $events))))
          FROM generate_series(1, $commits) g);
    PERFORM $1(b, recs);
  END LOOP;
END \$\$;
SQL
}
printf '%-6s %10s %10s %10s %8s\n' round "A ms" "B ms" "none ms" "B/A net"
for round in $(seq "$rounds"); do
  if [ $((round % 2)) = 1 ]; then ta=$(run commit_a "$round"); tb=$(run commit_b "$round"); else tb=$(run commit_b "$round"); ta=$(run commit_a "$round"); fi
  tn=$(run commit_none "$round")
  printf '%-6s %10s %10s %10s %8s\n' "$round" "$ta" "$tb" "$tn" "$(python3 -c "print(f'{($tb - $tn) / ($ta - $tn):.3f}')")"
done
