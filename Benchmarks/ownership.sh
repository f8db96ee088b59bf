#!/usr/bin/env bash
# Issue 8 benchmarks with the release server and CLI (make bench-ownership):
# thread/read against health/check (a request that touches no thread), p99 at
# half of the maximum, durable settings updates, and thread/read of 64 threads
# while one thread runs a held turn and another a slow tool call (wait_agent).
# Closed loop, same generator for every row; prints one line per run.
set -euo pipefail
BIN=${BIN:-.build/release}
PORT=${PORT:-7471}
DUR=${DUR:-5}
data=$(mktemp -d)
"$BIN/threadwire-server" --listen "127.0.0.1:$PORT" --data-dir "$data/store" --log-level error > "$data/out" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q listening "$data/out" 2>/dev/null && break; sleep 0.05; done
grep -q listening "$data/out" 2>/dev/null || { echo "a server did not start (port in use?): $(cat "$data/out")" >&2; exit 1; };
export THREADWIRE_SERVER="127.0.0.1:$PORT"

row() {  # name workload connections [extra bench args]
  local name=$1 workload=$2 connections=$3; shift 3
  "$BIN/threadwire" bench --workload "$workload" --connections "$connections" --duration "$DUR" --json "$@" 2>/dev/null |
    python3 -c "import json,sys; r=json.load(sys.stdin); l=r['latency_us']; print(f\"$name\t{r['throughput_per_second']:.0f} req/s\tp50 {l['p50']} µs\tp99 {l['p99']} µs\terrors {r['errors']}\")"
}

for c in 16 64; do
  row "health/check c=$c" health "$c"
  row "thread/read  c=$c" read "$c"
done
max=$("$BIN/threadwire" bench --workload read --connections 16 --duration "$DUR" --json 2>/dev/null |
  python3 -c "import json,sys; print(int(json.load(sys.stdin)['throughput_per_second']))")
row "thread/read  c=16 at half of max ($((max / 2)) req/s)" read 16 --rate $((max / 2))
row "settings/update c=16 (durable)" settings 16

row "thread/read  c=64, quiet server" read 64
# A held turn on one thread, and on another a wait_agent on a held child (a slow tool call).
id() { python3 -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])"; }
call() { "$BIN/threadwire" call "$1" --json "$2"; }
held=$(call thread/start '{}' | id)
call turn/start "{\"thread_id\": \"$held\", \"input\": [{\"text\": \"#hold\"}]}" > /dev/null
parent=$(call thread/start '{"config": [{"key": "features.multi_agent_v2", "value": "true"}]}' | id)
call turn/start "{\"thread_id\": \"$parent\", \"input\": [{\"text\": \"hi\"}]}" > /dev/null
sleep 0.5
call agent/spawn "{\"parent_thread_id\": \"$parent\", \"message\": \"#hold\"}" > /dev/null
call turn/start "{\"thread_id\": \"$parent\", \"input\": [{\"text\": \"#tool wait_agent {\\\"timeout_ms\\\": 300000}\"}]}" > /dev/null
row "thread/read  c=64, held turn + slow tool call" read 64
