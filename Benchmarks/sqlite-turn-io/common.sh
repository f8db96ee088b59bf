# Sourced by the scripts here: starts a server binary on a fresh SQLite store
# (cli_load.sh's start_server) and warms it with a workload (the release
# CLI's `bench`, 16 connections, 2 s).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cli=${CLI_BIN:-$root/.build/release/threadwire}
out=${OUT:-$(mktemp -d)}
. "$root/Benchmarks/cli_load.sh"
start_warm() {  # server_bin workload -> $pid $port $dir (the store is $dir/store)
  dir=$(mktemp -d); work=$dir; server_bin=$1
  start_server warm
  pid=$server_pid
  ln -s "$dir/data-warm" "$dir/store"
  "$cli" bench --server "127.0.0.1:$port" --workload "$2" --connections 16 --duration 2 --json > /dev/null
}
bench_rps() {  # workload seconds -> requests per second
  "$cli" bench --server "127.0.0.1:$port" --workload "$1" --connections 16 --duration "$2" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["throughput_per_second"])'
}
