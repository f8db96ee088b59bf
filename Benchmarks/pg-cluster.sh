# Sourced by the PostgreSQL benchmarks: a throwaway cluster (initdb as the
# postgres user when root, fsync on) on a free port with a database "tw",
# stopped and deleted at exit. Sets $work, $pgbin, $pgport and as_pg.
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
work=$(mktemp -d)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$work"
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  as_pg "$pgbin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
pgport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as_pg "$pgbin/initdb" -D "$work/pg" -U threadwire --auth=trust >/dev/null
as_pg "$pgbin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w -o "-p $pgport -k $work -c listen_addresses=127.0.0.1" start >/dev/null
"$pgbin/createdb" -h 127.0.0.1 -p "$pgport" -U threadwire tw
