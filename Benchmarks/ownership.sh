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
ROUNDS=${ROUNDS:-3}
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

median() {  # file label: medians of the rows' req/s and p99
  python3 - "$1" "$2" <<'PY'
import re, statistics, sys
rows = [l for l in open(sys.argv[1]) if "req/s" in l]
rate = statistics.median(float(re.search(r"\t(\d+) req/s", l).group(1)) for l in rows)
p99 = statistics.median(float(re.search(r"p99 (\d+)", l).group(1)) for l in rows)
print(f"median of {len(rows)}: {sys.argv[2]}\t{rate:.0f} req/s\tp99 {p99:.0f} µs")
PY
}

for c in 16 64; do
  row "health/check c=$c" health "$c"
  row "thread/read  c=$c" read "$c"
done
# p99 at half of the maximum: ROUNDS runs, each at half of the maximum just measured.
for r in $(seq "$ROUNDS"); do
  max=$("$BIN/threadwire" bench --workload read --connections 16 --duration "$DUR" --json 2>/dev/null |
    python3 -c "import json,sys; print(int(json.load(sys.stdin)['throughput_per_second']))")
  row "thread/read  c=16 at half of max ($((max / 2)) req/s), round $r" read 16 --rate $((max / 2))
done | tee "$data/half"
median "$data/half" "thread/read c=16 at half of max"
row "settings/update c=16 (durable)" settings 16

# Reads of 64 threads on a quiet server, then while one thread runs a held
# turn and another waits (wait_agent) on a held child, a slow tool call;
# interleaved for ROUNDS rounds (the busy threads are interrupted after each).
id() { python3 -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])"; }
turn() { python3 -c "import json,sys; print(json.load(sys.stdin)['turn']['id'])"; }
call() { "$BIN/threadwire" call "$1" --json "$2"; }
for r in $(seq "$ROUNDS"); do
  row "thread/read  c=64, quiet server, round $r" read 64 >> "$data/quiet"
  tail -1 "$data/quiet"
  held=$(call thread/start '{}' | id)
  held_turn=$(call turn/start "{\"thread_id\": \"$held\", \"input\": [{\"text\": \"#hold\"}]}" | turn)
  parent=$(call thread/start '{"config": [{"key": "features.multi_agent_v2", "value": "true"}]}' | id)
  call turn/start "{\"thread_id\": \"$parent\", \"input\": [{\"text\": \"hi\"}]}" > /dev/null
  sleep 0.5
  call agent/spawn "{\"parent_thread_id\": \"$parent\", \"message\": \"#hold\"}" > /dev/null
  wait_turn=$(call turn/start "{\"thread_id\": \"$parent\", \"input\": [{\"text\": \"#tool wait_agent {\\\"timeout_ms\\\": 300000}\"}]}" | turn)
  row "thread/read  c=64, held turn + slow tool call, round $r" read 64 >> "$data/busy"
  tail -1 "$data/busy"
  call turn/interrupt "{\"thread_id\": \"$held\", \"turn_id\": \"$held_turn\"}" > /dev/null
  call turn/interrupt "{\"thread_id\": \"$parent\", \"turn_id\": \"$wait_turn\"}" > /dev/null
done
median "$data/quiet" "thread/read c=64, quiet server"
median "$data/busy" "thread/read c=64, held turn + slow tool call"
