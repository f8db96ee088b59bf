#!/usr/bin/env bash
# The store's file writes per request: each build serves WORKLOAD (default
# settings: one thread/settings/update per request) at 16 connections on
# SQLite while `strace -c` counts the server's pwrite64 (WAL frames and
# checkpoints), pread64 and fdatasync over the whole run; prints each per
# request (answered requests = the generator's req/s × its seconds).
# Usage: Benchmarks/store-syscalls.sh NAME=/path/to/threadwire-server ...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cli_bin=${CLI_BIN:-$root/.build/release/threadwire}
seconds=${SECONDS_PER_RUN:-8}
workload=${WORKLOAD:-settings}
runs=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v strace > /dev/null || { echo "strace is not installed" >&2; exit 1; }
. "$root/Benchmarks/cli_load.sh"
printf '%-10s %8s %10s %10s %10s\n' build "req/s" "pwrite/rq" "pread/rq" "fdatasync/rq"
for spec in "$@"; do
  name=${spec%%=*}; server_bin=${spec#*=}
  start_server "$name"
  measure "$workload" 16 > /dev/null   # warm-up
  strace -c -f -e trace=pwrite64,pread64,fdatasync -p "$server_pid" -o "$work/$name.strace" 2> /dev/null &
  strace_pid=$!
  sleep 0.5
  read -r rps _ _ <<< "$(measure "$workload" 16)"
  kill -INT "$strace_pid"; wait "$strace_pid" 2> /dev/null || true
  kill "$server_pid"; wait "$server_pid" 2> /dev/null || true
  count() { awk -v call="$1" '$NF == call {print $4}' "$work/$name.strace" | head -1; }
  per() { python3 -c "print(f'{${1:-0} / ($rps * $seconds):.2f}')"; }
  printf '%-10s %8s %10s %10s %10s\n' "$name" "$rps" "$(per "$(count pwrite64)")" "$(per "$(count pread64)")" "$(per "$(count fdatasync)")"
done
