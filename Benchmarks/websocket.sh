#!/usr/bin/env bash
# Issue 50: WebSocket (--web-listen, path /ws) against TCP frames on the same
# server, both driven by the one C generator (Benchmarks/c/frame_load.c;
# WEBSOCKET=/ws makes it upgrade, then send each frame's payload as one
# masked binary message and read one message per answer), with the server's
# CPU per request (user + system from /proc over each run). A_BIN=PATH adds a
# second build (say, the one before a change), interleaved with B's round by
# round. Medians of ROUNDS rounds. make bench-websocket.
set -euo pipefail
BIN=${BIN:-.build/release}
DUR=${DUR:-3}
ROUNDS=${ROUNDS:-3}
source Benchmarks/c_load.sh
labels=(B); declare -A bins=([B]=${B_BIN:-$BIN/threadwire-server}) ports=([B]=7682) web_ports=([B]=7683) server_pids=()
if [ -n "${A_BIN:-}" ]; then labels=(A B); bins[A]=$A_BIN; ports[A]=7680; web_ports[A]=7681; fi
declare -A server_pid
for l in "${labels[@]}"; do
  "${bins[$l]}" --listen 127.0.0.1:${ports[$l]} --web-listen 127.0.0.1:${web_ports[$l]} --data-dir "$data/store-$l" --log-level error > "$data/$l.out" 2>&1 &
  pids+=($!); server_pid[$l]=$!
done
for l in "${labels[@]}"; do listening "$l.out"; done
for _ in $(seq 200); do ready=1; for l in "${labels[@]}"; do grep -q "web on" "$data/$l.out" || ready=0; done; [ $ready = 1 ] && break; sleep 0.05; done
declare -A reads
for l in "${labels[@]}"; do
  thread=$("$BIN/threadwire" call --server 127.0.0.1:${ports[$l]} thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])")
  reads[$l]=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$thread'")
done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # pid, transport (tcp|ws), then frame_load's arguments: "req/s p50 p99 cpu_us"
  local pid=$1 transport=$2; shift 2
  local t0 t1 out
  t0=$(ticks "$pid")
  if [ "$transport" = ws ]; then out=$(WEBSOCKET=/ws .build/c/frame_load "$@"); else out=$(.build/c/frame_load "$@"); fi
  t1=$(ticks "$pid")
  [ "$(field "$out" errors)" = 0 ] || { echo "the generator saw errors: $out" >&2; exit 1; }
  "$PY" -c "
import json; r = json.loads('$out')
print(r['requests_per_second'], r['p50_us'], r['p99_us'], round(($t1 - $t0) * 1e6 / $(getconf CLK_TCK) / (r['requests_per_second'] * $DUR), 1))"
}
declare -A results
for c in 1 16 64; do
  for round in $(seq "$ROUNDS"); do
    for l in "${labels[@]}"; do
      for workload in health read; do
        for transport in tcp ws; do
          port=${ports[$l]}; [ $transport = ws ] && port=${web_ports[$l]}
          if [ $workload = health ]; then r=$(run "${server_pid[$l]}" $transport $port $c "$DUR" "$HEALTH")
          else r=$(run "${server_pid[$l]}" $transport $port $c "$DUR" "${reads[$l]}" "$INIT"); fi
          results[$l,$workload,$c,$transport]+="$r;"
        done
      done
    done
  done
done
printf "build\tworkload\tconnections\tTCP frames req/s (p50 / p99 µs, CPU µs/request)\tWebSocket req/s (p50 / p99 µs, CPU µs/request)\tWebSocket / TCP\n"
for l in "${labels[@]}"; do
  for workload in health read; do
    for c in 1 16 64; do
      "$PY" - "$l" "$workload" "$c" "${results[$l,$workload,$c,tcp]}" "${results[$l,$workload,$c,ws]}" <<'PY'
import statistics, sys
label, workload, c, tcp, ws = sys.argv[1:]
def rows(s): return [list(map(float, r.split())) for r in s.strip(";").split(";")]
def med(rs, i): return statistics.median(r[i] for r in rs)
t, w = rows(tcp), rows(ws)
ratios = [b[0] / a[0] for a, b in zip(t, w)]
name = "health/check" if workload == "health" else "thread/read"
print(f"{label}\t{name}\t{c}\t{med(t,0):.0f} ({med(t,1):.0f} / {med(t,2):.0f}, {med(t,3):.1f})\t{med(w,0):.0f} ({med(w,1):.0f} / {med(w,2):.0f}, {med(w,3):.1f})\t{100*statistics.median(ratios):.0f} % (rounds: {', '.join(f'{100*r:.0f}' for r in ratios)})")
PY
    done
  done
done
