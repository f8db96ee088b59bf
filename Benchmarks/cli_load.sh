# Sourced by the scripts that load a release server with the release CLI's
# generator (postgres.sh, idempotency.sh): needs $server_bin, $cli_bin,
# $work, $runs and $seconds.
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

start_server() {  # name, flags... -> $server_pid, $port
  local name=$1; shift
  "$server_bin" --listen 127.0.0.1:0 --data-dir "$work/data-$name" --log-level error "$@" > "$work/$name.out" &
  server_pid=$!
  for _ in $(seq 150); do grep -q "listening on" "$work/$name.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "listening on" "$work/$name.out" || { echo "server $name did not start" >&2; exit 1; }
  port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$work/$name.out" | head -1)
}

measure() {  # workload connections [bench flags...] -> "rps p50 p99", the median run of $runs
  local workload=$1 connections=$2; shift 2
  for _ in $(seq "$runs"); do
    "$cli_bin" bench --server "127.0.0.1:$port" --workload "$workload" --connections "$connections" --duration "$seconds" --json "$@" |
      python3 -c 'import json,sys; r=json.load(sys.stdin); print(int(r["throughput_per_second"]), r["latency_us"]["p50"], r["latency_us"]["p99"])'
  done | sort -n | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'
}
