#!/usr/bin/env bash
# A/B of two server builds' tracing cost: health/check from the C generator
# (closed loop) at CONNS connections with tracing off, at 10 % and at 100 %
# sampling (the exporter pointed at a closed port: spans are made, batched
# and dropped), both builds interleaved so that machine noise hits both
# alike. Server CPU per request from /proc/PID/stat. Usage:
#   BASE_BIN=/path/to/baseline/release Benchmarks/tracing-ab.sh
# where BASE_BIN holds a threadwire-server built from the baseline commit.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${BASE_BIN:?set BASE_BIN to a directory with the baseline threadwire-server}
source Benchmarks/c_load.sh
port=${PORT:-7592}
conns=${CONNS:-16}
seconds=${SECONDS_PER_RUN:-4}
run() {  # directory-of-server ratio|off label
  local bin=$1 mode=$2 envs=()
  if [ "$mode" != off ]; then
    envs+=(OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9 OTEL_EXPORTER_OTLP_TIMEOUT=500
           OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=$mode)
  fi
  rm -rf "$data/store"
  env "${envs[@]}" "$bin/threadwire-server" --listen 127.0.0.1:$port --data-dir "$data/store" --log-level error > "$data/tw.out" 2>&1 &
  local server=$!
  pids+=($server)
  sleep 1.5
  load $port "$conns" 1 "$HEALTH" > /dev/null
  local before=$(awk '{print $14 + $15}' /proc/$server/stat)
  local result=$(load $port "$conns" "$seconds" "$HEALTH")
  local after=$(awk '{print $14 + $15}' /proc/$server/stat)
  kill $server; wait $server 2>/dev/null || true
  "$PY" -c "
import json, sys
r = json.loads(sys.argv[1])
cpu = ($after - $before) / 100 * 1e6 / (r['requests_per_second'] * $seconds)
print(f\"{sys.argv[2]:>8} {sys.argv[3]:>4}: {r['requests_per_second']:>7.0f} req/s  p50 {r['p50_us']} µs  p99 {r['p99_us']} µs  server CPU {cpu:.1f} µs/req\")
" "$result" "$3" "$mode"
}
for round in $(seq "${RUNS:-2}"); do
  for mode in off 0.1 1.0; do
    run "$base" $mode base
    run .build/release $mode new
  done
done
