#!/usr/bin/env bash
# Issue 47: what per-principal quotas cost per request. The release server
# with bearer tokens, on SQLite (the buckets in the process) and on
# PostgreSQL (the buckets in the store, shared by instances), quotas off
# (every limit 0) and on (the authenticated defaults, with the request rate
# raised to 100000/s so the run measures the checks, not refusals; the
# PostgreSQL gate then claims 5000 tokens per round trip). health/check is
# not counted (it answers before initialize too); thread/settings/update is.
# Medians of RUNS runs of SECONDS_PER_RUN s at 16 connections.
# Usage: Benchmarks/quotas.sh (make bench-quotas)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${SERVER_BIN:-$root/.build/release/threadwire-server}
cli_bin=${CLI_BIN:-$root/.build/release/threadwire}
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-3}
. "$root/Benchmarks/pg-cluster.sh"
. "$root/Benchmarks/cli_load.sh"
token=bench-token-0123456789abcdef
echo "bench $token" > "$work/tokens"
chmod 600 "$work/tokens"
off=(--max-threads-started-per-minute 0 --max-running-turns 0 --max-requests-per-second 0 --max-stored-bytes 0)
on=(--max-requests-per-second 100000)

declare -A result
for store in ${STORES:-sqlite postgres}; do
  for quotas in off on; do
    name=$store-$quotas
    flags=(--auth-tokens "$work/tokens")
    [ $quotas = off ] && flags+=("${off[@]}") || flags+=("${on[@]}")
    if [ $store = postgres ]; then
      # A fresh database each time: the same rows, tables and indexes.
      "$pgbin/createdb" -h 127.0.0.1 -p "$pgport" -U threadwire "$name"
      flags+=(--store "postgres://threadwire@127.0.0.1:$pgport/$name" --peer-token bench-peer-secret-0123456789)
    fi
    start_server "$name" "${flags[@]}"
    for workload in health settings; do
      result[$name,$workload]=$(measure $workload 16 --auth-token "$token")
    done
    kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
  done
done

printf '%-9s %-9s %12s %12s %8s\n' store workload "off req/s" "on req/s" "on/off"
for store in ${STORES:-sqlite postgres}; do
  for workload in health settings; do
    read -r off_rps _ <<< "${result[$store-off,$workload]}"
    read -r on_rps _ <<< "${result[$store-on,$workload]}"
    printf '%-9s %-9s %12s %12s %8s\n' $store $workload "$off_rps" "$on_rps" "$(python3 -c "print(f'{$on_rps/$off_rps:.3f}')")"
  done
done
for key in "${!result[@]}"; do echo "$key: ${result[$key]} (req/s p50_us p99_us)"; done | sort
