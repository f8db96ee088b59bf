#!/usr/bin/env bash
# Issue 28, fan-out: one thread with SUBSCRIBERS subscribed connections and a
# turn streaming CHUNKS deltas, one every DELAY_MS (100/s by default), from the
# stamping fake provider (Tests/provider/fake_openai.py). The watchers are one
# single-threaded C epoll process (Benchmarks/c/fanout_watch.c) so they take
# as little of the 2 cores as possible; each delta's latency is its receive
# time minus the provider's send stamp, so it includes the provider -> server
# hop: an upper bound on the time from the server having the delta to the
# subscriber's socket. Then IDLE subscribed connections that never get a
# notification, for the server's resident memory per idle subscriber.
# SUBSCRIBERS (a list: one run each), CHUNKS, DELAY_MS, IDLE; PERF=1 profiles the server.
# Usage: Benchmarks/fanout.sh   (make bench-fanout)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BIN=${BIN:-.build/release}
subscribers=${SUBSCRIBERS:-1 100 250 500 1000}; chunks=${CHUNKS:-500}; delay=${DELAY_MS:-10}; idle=${IDLE:-10000}
source Benchmarks/c_load.sh
cc -O2 -o .build/c/fanout_watch Benchmarks/c/fanout_watch.c

python3 -u Tests/provider/fake_openai.py > "$data/provider.out" &
pids+=($!)
listening provider.out
provider_port=$(awk '{print $2}' "$data/provider.out")
python3 - "$provider_port" "$chunks" "$delay" <<'PY'
import json, sys, urllib.request
port, chunks, delay = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
chunk = lambda delta, finish=None: json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
events = [{"delay_ms": delay, "data": chunk({"content": "ts={ts};"})} for _ in range(chunks)]
events.append({"data": chunk({}, "stop")})
request = urllib.request.Request(f"http://127.0.0.1:{port}/control/default",
                                 data=json.dumps({"events": events, "echo_timestamps": True}).encode(), method="POST")
urllib.request.urlopen(request).read()
PY
cat > "$data/config.json" <<JSON
{"model_providers": [{"name": "fake", "base_url": "http://127.0.0.1:$provider_port/v1", "stream_idle_timeout_ms": 30000}],
 "models": [{"slug": "remote-1", "provider": "fake"}]}
JSON

start_server() {
  "$BIN/threadwire-server" --listen 127.0.0.1:0 --data-dir "$data/store-$1" --config "$data/config.json" \
    --max-connections $((idle + 1100)) --log-level error > "$data/server-$1.out" 2>&1 &
  server_pid=$!
  pids+=($server_pid)
  for _ in $(seq 150); do grep -q "listening on" "$data/server-$1.out" 2>/dev/null && break; sleep 0.1; done
  port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$data/server-$1.out" | head -1)
  thread=$("$BIN/threadwire" call --server "127.0.0.1:$port" thread/start --json '{"model": "remote-1"}' \
    | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])")
  setup=$(frame "e.request.id = 1; e.request.initialize.client_info.name = 'fanout-watch'; e.request.initialize.protocol_version = 1")$(frame "e.request.id = 2; e.request.thread_resume.thread_id = '$thread'; e.request.thread_resume.exclude_turns = True")
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$server_pid/stat"; }
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$server_pid/status"; }
wait_ready() { for _ in $(seq 600); do grep -q ready "$1" 2>/dev/null && return; sleep 0.1; done; echo "watchers never subscribed: $(cat "$1")" >&2; exit 1; }

report() {  # label, watcher's JSON line, server CPU seconds, subscribers
  "$PY" - "$@" "$chunks" <<'PY'
import json, sys
label, r, seconds, subs, chunks = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
print(f"  {label}: every subscriber got every delta: {r['complete'] == subs and r['missing'] == 0} "
      f"({r['complete']} of {subs} complete, {r['missing']} missing, {r['refused']} refused, {r['closed']} closed)")
print(f"    chunk -> subscriber socket: p50 {r['p50_us'] / 1000:.1f} ms, p99 {r['p99_us'] / 1000:.1f} ms, max {r['max_us'] / 1000:.1f} ms")
print(f"    chunk -> last subscriber's socket, per delta: p50 {r['last_subscriber_p50_us'] / 1000:.1f} ms, "
      f"p99 {r['last_subscriber_p99_us'] / 1000:.1f} ms, max {r['last_subscriber_max_us'] / 1000:.1f} ms")
print(f"    server CPU {seconds:.2f} s: {seconds / (chunks * subs) * 1e6:.2f} us per notification per subscriber; watchers' CPU {r['cpu_s']:.2f} s")
PY
}

# 1. Streaming to many subscribers: for each count, the C ceiling (the same
# frames written by a bare epoll server, one write per subscriber per delta),
# then threadwire (a new set of watchers and a new turn on the same thread).
cc -O2 -o .build/c/fanout_ceiling Benchmarks/c/fanout_ceiling.c
start_server stream
for count in $subscribers; do
echo "$count subscribers, $chunks deltas one every $delay ms:"
.build/c/fanout_ceiling 0 "$count" 2 "$chunks" "$delay" > "$data/ceiling.out" &
ceiling_pid=$!
listening ceiling.out
ceiling_port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$data/ceiling.out")
.build/c/fanout_watch "$ceiling_port" "$count" "$chunks" $((chunks * delay / 1000 + 60)) "$setup" 2 > "$data/watch.out"
wait $ceiling_pid
report "C ceiling " "$(tail -1 "$data/watch.out")" "$("$PY" -c "import json,sys; print(json.loads(sys.argv[1])['cpu_s'])" "$(tail -1 "$data/ceiling.out")")" "$count"

.build/c/fanout_watch "$port" "$count" "$chunks" $((chunks * delay / 1000 + 60)) "$setup" 2 > "$data/watch.out" &
watch_pid=$!
wait_ready "$data/watch.out"
before=$(cpu_ticks)
if [ -n "${PERF:-}" ]; then perf record -F 999 -g -p "$server_pid" -o "$data/perf.data" > /dev/null 2>&1 & perf_pid=$!; fi
"$BIN/threadwire" call --server "127.0.0.1:$port" turn/start --json "{\"thread_id\": \"$thread\", \"input\": [{\"text\": \"stream\"}]}" > /dev/null
wait $watch_pid
after=$(cpu_ticks)
if [ -n "${PERF:-}" ]; then
  kill -INT "$perf_pid"; wait "$perf_pid" || true
  perf report -i "$data/perf.data" --no-children --sort ${PERF_SORT:-symbol} --stdio ${PERF_ARGS:-} 2>/dev/null | grep -E "${PERF_GREP:-^ +[0-9]}" | head -${PERF_TOP:-40} || true  # head closing the pipe is not a failure
fi
report "threadwire" "$(tail -1 "$data/watch.out")" "$("$PY" -c "print(($after - $before) / $(getconf CLK_TCK))")" "$count"
done
kill "$server_pid"; wait "$server_pid" 2>/dev/null || true

# 2. Idle subscribers.
start_server idle
rss_before=$(rss_kib)
.build/c/fanout_watch "$port" "$idle" 0 5 "$setup" 2 > "$data/idle.out" &
watch_pid=$!
wait_ready "$data/idle.out"
sleep 2
rss_after=$(rss_kib)
wait $watch_pid
echo "$idle idle subscribers: $(tail -1 "$data/idle.out")"
echo "server RSS $((rss_before / 1024)) MiB before, $((rss_after / 1024)) MiB with $idle subscribed: $(( (rss_after - rss_before) / idle )) KiB per idle subscriber"
