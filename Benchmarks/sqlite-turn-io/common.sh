# Sourced by the scripts here: starts SERVER_BIN on a fresh SQLite store and
# warms it with WORKLOAD (the release CLI's `bench`, 16 connections, 2 s).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cli=${CLI_BIN:-$root/.build/release/threadwire}
out=${OUT:-$(mktemp -d)}
start_warm() {  # server_bin workload -> $pid $port $dir
  dir=$(mktemp -d)
  "$1" --listen 127.0.0.1:0 --data-dir "$dir/store" --log-level error > "$dir/out" 2>&1 &
  pid=$!
  for _ in $(seq 150); do grep -q "listening on" "$dir/out" && break; sleep 0.1; done
  grep -q "listening on" "$dir/out" || { echo "server did not start: $(cat "$dir/out")" >&2; exit 1; }
  port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$dir/out" | head -1)
  "$cli" bench --server "127.0.0.1:$port" --workload "$2" --connections 16 --duration 2 --json > /dev/null
}
bench_rps() {  # workload seconds -> requests per second
  "$cli" bench --server "127.0.0.1:$port" --workload "$1" --connections 16 --duration "$2" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["throughput_per_second"])'
}
