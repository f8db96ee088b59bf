# Sourced by the PostgreSQL A/B benchmarks (postgres-ab.sh,
# postgres-cpu-ab.sh): the two builds (BASE_BIN's threadwire-server against
# this tree's release build), a throwaway cluster with a database for each,
# the C settings/update generator, and start_build. Needs $root.
base_server=${BASE_BIN:?set BASE_BIN to a directory with the baseline threadwire-server}/threadwire-server
new_server=$root/.build/release/threadwire-server
cli_bin=$root/.build/release/threadwire
. "$root/Benchmarks/pg-cluster.sh"
. "$root/Benchmarks/c_settings_load.sh"
"$pgbin/createdb" -h 127.0.0.1 -p "$pgport" -U threadwire tw_base

start_build() {  # base|new -> that build's server on its own database: $pid, $port
  local build=$1 bin db
  if [ "$build" = base ]; then bin=$base_server; db=tw_base; else bin=$new_server; db=tw; fi
  "$bin" --listen 127.0.0.1:0 --data-dir "$work/data-$build" --log-level error \
    --store "postgres://threadwire@127.0.0.1:$pgport/$db" > "$work/$build.out" &
  pid=$!
  for _ in $(seq 150); do grep -q "listening on" "$work/$build.out" 2>/dev/null && break; sleep 0.1; done
  port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$work/$build.out" | head -1)
}
