#!/usr/bin/env bash
# Issue 27: what idempotency keys cost. The release server on SQLite, then on
# a throwaway PostgreSQL (fsync and synchronous_commit on), loaded by the
# release CLI's closed-loop generator with settings (thread/settings/update)
# and turn (turn/start to turn/completed), each without and with a new
# idempotency key per change (the key is looked up, claimed in the change's
# transaction, and the answer recorded with it), at 1 and 16 connections.
# Medians of RUNS runs of SECONDS_PER_RUN s, all in one run.
# Usage: Benchmarks/idempotency.sh (make bench-idempotency)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${SERVER_BIN:-$root/.build/release/threadwire-server}
cli_bin=${CLI_BIN:-$root/.build/release/threadwire}
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-5}
. "$root/Benchmarks/pg-cluster.sh"

. "$root/Benchmarks/cli_load.sh"

printf '%-9s %-9s %5s | %-28s | %-28s | %s\n' store workload conns "without keys: req/s p50 p99 µs" "with keys: req/s p50 p99 µs" "keyed/plain"
for store in sqlite postgres; do
  if [ $store = sqlite ]; then start_server sqlite; else start_server postgres --store "postgres://threadwire@127.0.0.1:$pgport/tw"; fi
  for workload in settings turn; do
    for connections in 1 16; do
      plain=$(measure $workload $connections)
      keyed=$(measure $workload $connections --idempotency-keys)
      ratio=$(python3 -c "print(f'{int(\"$keyed\".split()[0]) / max(1, int(\"$plain\".split()[0])) * 100:.0f} %')")
      printf '%-9s %-9s %5s | %-28s | %-28s | %s\n' $store $workload $connections "$plain" "$keyed" "$ratio"
    done
  done
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
done
