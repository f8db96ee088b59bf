#!/usr/bin/env bash
# Issue 12: two release instances on one throwaway PostgreSQL cluster: the
# latency one relay hop adds, and failover time after kill -9 of an owner
# (Benchmarks/cluster.py), then 1 vs 3 instances. Usage: Benchmarks/cluster.sh (make bench-cluster)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${SERVER_BIN:-$root/.build/release/threadwire-server}
. "$root/Benchmarks/pg-cluster.sh"
PYTHONPATH="$root/clients/python" "$root/.build/venv/bin/python" "$root/Benchmarks/cluster.py" \
  "$server_bin" "postgres://threadwire@127.0.0.1:$pgport/tw" "${LEASE_SECONDS:-10}"

# 1 vs 3 instances: the same 48 connections of the release CLI's generator on
# one instance, then 16 on each of three (three generators at once, each on
# threads its own instance owns: no relaying). Throughput summed; medians of
# RUNS runs of SECONDS_PER_RUN s. All of it shares this machine's cores.
cli_bin=${CLI_BIN:-$root/.build/release/threadwire}
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-5}
url="postgres://threadwire@127.0.0.1:$pgport/tw"
ports=()
pids=()
for i in 0 1 2; do
  out="$work/instance-$i.out"
  "$server_bin" --listen 127.0.0.1:0 --store "$url" --log-level error > "$out" &
  pids+=($!)
  for _ in $(seq 150); do grep -q "listening on" "$out" 2>/dev/null && break; sleep 0.1; done
  ports+=("$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$out")")
done
bench() {  # port connections workload -> requests/s
  "$cli_bin" bench --server "127.0.0.1:$1" --workload "$3" --connections "$2" --duration "$seconds" --json |
    python3 -c 'import json,sys; print(int(json.load(sys.stdin)["throughput_per_second"]))'
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '\n| workload | 1 instance, 48 connections | 3 instances, 16 connections each | ratio |\n|---|---|---|---|\n'
for workload in read settings; do
  one=$(for _ in $(seq "$runs"); do bench "${ports[0]}" 48 "$workload"; done | median)
  three=$(for _ in $(seq "$runs"); do
    generators=()
    for i in 0 1 2; do bench "${ports[$i]}" 16 "$workload" > "$work/part-$i" & generators+=($!); done
    wait "${generators[@]}"
    cat "$work"/part-* | awk '{s+=$1} END {print s}'
  done | median)
  echo "| $workload | $one | $three | $(python3 -c "print(f'{$three/$one:.2f}x')") |"
done
kill "${pids[@]}" 2>/dev/null || true
