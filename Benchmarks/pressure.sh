#!/usr/bin/env bash
# Issue 9 benchmarks (make bench-pressure): what backpressure, limits and the
# Prometheus backend cost. health/check and thread/read, closed loop, against
# this tree's release server ("with") and the release server of BASE_REV, the
# last commit before them ("without"), alternating runs in one session; then
# /metrics scrape times while 64 connections load the server at full speed.
set -euo pipefail
BIN=${BIN:-.build/release}
DUR=${DUR:-5}
ROUNDS=${ROUNDS:-2}
BASE_REV=${BASE_REV:-113d4cf}
BASE_DIR=${BASE_DIR:-.build/bench-base}
if [ ! -x "$BASE_DIR/.build/release/threadwire-server" ]; then
  rm -rf "$BASE_DIR"
  git worktree add --force --detach "$BASE_DIR" "$BASE_REV" > /dev/null
  (cd "$BASE_DIR" && swift build -c release --product threadwire-server > /dev/null)
fi
BASE_BIN="$BASE_DIR/.build/release/threadwire-server"

start() {  # binary port [extra args]; sets pid and data
  local binary=$1 port=$2; shift 2
  data=$(mktemp -d)
  "$binary" --listen "127.0.0.1:$port" --data-dir "$data/store" --log-level error "$@" > "$data/out" 2>&1 &
  pid=$!
  for _ in $(seq 200); do grep -q listening "$data/out" 2>/dev/null && break; sleep 0.05; done
  grep -q listening "$data/out" 2>/dev/null || { echo "a server did not start (port in use?): $(cat "$data/out")" >&2; exit 1; };
}
stop() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; rm -rf "$data"; }
trap 'stop' EXIT

row() {  # label port workload connections
  THREADWIRE_SERVER="127.0.0.1:$2" "$BIN/threadwire" bench --workload "$3" --connections "$4" --duration "$DUR" --json 2>/dev/null |
    python3 -c "import json,sys; r=json.load(sys.stdin); l=r['latency_us']; print(f\"$1\t$3 c=$4\t{r['throughput_per_second']:.0f} req/s\tp50 {l['p50']} µs\tp99 {l['p99']} µs\terrors {r['errors']}\")"
}

for round in $(seq "$ROUNDS"); do
  for variant in without with; do
    if [ $variant = with ]; then start "$BIN/threadwire-server" 7481; else start "$BASE_BIN" 7481; fi
    for c in 16 64; do
      row "$variant" 7481 health $c
      row "$variant" 7481 read $c
    done
    stop
  done
done

# /metrics under full load: 64 connections of thread/read while scraping.
start "$BIN/threadwire-server" 7482 --admin-listen 127.0.0.1:7483
THREADWIRE_SERVER=127.0.0.1:7482 "$BIN/threadwire" bench --workload read --connections 64 --duration $((DUR + 2)) --json > /dev/null 2>&1 &
load=$!
sleep 1
python3 - <<'PY'
import time, urllib.request
times = []
for _ in range(50):
    start = time.perf_counter()
    body = urllib.request.urlopen("http://127.0.0.1:7483/metrics").read()
    times.append((time.perf_counter() - start) * 1000)
    time.sleep(0.05)
times.sort()
print(f"/metrics scrape under load (64 conns of thread/read): {len(times)} scrapes, {len(body)} bytes, "
      f"p50 {times[len(times)//2]:.2f} ms, p99 {times[int(len(times)*0.99)-1]:.2f} ms, max {times[-1]:.2f} ms")
PY
wait $load || true
