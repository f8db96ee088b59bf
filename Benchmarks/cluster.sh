#!/usr/bin/env bash
# Issue 12: two release instances on one throwaway PostgreSQL cluster: the
# latency one relay hop adds, and failover time after kill -9 of an owner
# (Benchmarks/cluster.py). Usage: Benchmarks/cluster.sh (make bench-cluster)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${SERVER_BIN:-$root/.build/release/threadwire-server}
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
work=$(mktemp -d)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$work"
cleanup() {
  as_pg "$pgbin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
pgport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as_pg "$pgbin/initdb" -D "$work/pg" -U threadwire --auth=trust >/dev/null
as_pg "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w -o "-p $pgport -k $work -c listen_addresses=127.0.0.1" start >/dev/null
"$pgbin/createdb" -h 127.0.0.1 -p "$pgport" -U threadwire tw
PYTHONPATH="$root/clients/python" "$root/.build/venv/bin/python" "$root/Benchmarks/cluster.py" \
  "$server_bin" "postgres://threadwire@127.0.0.1:$pgport/tw" "${LEASE_SECONDS:-10}"
