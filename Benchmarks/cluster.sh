#!/usr/bin/env bash
# Issue 12: two release instances on one throwaway PostgreSQL cluster: the
# latency one relay hop adds, and failover time after kill -9 of an owner
# (Benchmarks/cluster.py). Usage: Benchmarks/cluster.sh (make bench-cluster)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${SERVER_BIN:-$root/.build/release/threadwire-server}
. "$root/Benchmarks/pg-cluster.sh"
PYTHONPATH="$root/clients/python" "$root/.build/venv/bin/python" "$root/Benchmarks/cluster.py" \
  "$server_bin" "postgres://threadwire@127.0.0.1:$pgport/tw" "${LEASE_SECONDS:-10}"
