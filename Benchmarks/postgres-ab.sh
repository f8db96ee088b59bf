#!/usr/bin/env bash
# A/B of two server builds on the PostgreSQL store, interleaved on one
# throwaway cluster (each build on its own database) so that machine noise
# hits both alike. Usage:
#   BASE_BIN=/path/to/baseline/release Benchmarks/postgres-ab.sh
# where BASE_BIN holds a threadwire-server built from the baseline commit
# (e.g. `git stash -u && swift build -c release && cp .build/release/threadwire-server DIR`).
# Medians of RUNS rounds of SECONDS_PER_RUN s per workload and connection
# count; "settings-c" is settings/update from the independent C generator.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-5}
. "$root/Benchmarks/pg-ab.sh"

declare -A samples
for round in $(seq "$runs"); do
  for build in base new; do
    start_build $build
    for workload in settings turn; do
      for connections in 1 16; do
        rps=$("$cli_bin" bench --server "127.0.0.1:$port" --workload $workload --connections $connections --duration "$seconds" --json |
          python3 -c 'import json,sys; r=json.load(sys.stdin); print(int(r["throughput_per_second"]), r["latency_us"]["p50"], r["latency_us"]["p99"])')
        samples[$build,$workload,$connections]+="$rps"$'\n'
      done
    done
    for connections in 1 16; do
      samples[$build,settings-c,$connections]+="$(load_settings_c $connections)"$'\n'
    done
    kill $pid; wait $pid 2>/dev/null || true
  done
done

median() { grep . | sort -n | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'; }
printf '\n| workload | connections | baseline req/s (p50 / p99 µs) | this build req/s (p50 / p99 µs) | change |\n|---|---|---|---|---|\n'
for workload in settings turn settings-c; do
  for connections in 1 16; do
    read -r b_rps b_p50 b_p99 <<< "$(printf '%s' "${samples[base,$workload,$connections]}" | median)"
    read -r n_rps n_p50 n_p99 <<< "$(printf '%s' "${samples[new,$workload,$connections]}" | median)"
    echo "| $workload | $connections | $b_rps ($b_p50 / $b_p99) | $n_rps ($n_p50 / $n_p99) | $(python3 -c "print(f'{$n_rps/$b_rps:.2f}×')") |"
  done
done
