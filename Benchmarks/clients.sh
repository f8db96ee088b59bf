#!/usr/bin/env bash
# Issue 25: the Go and TypeScript clients against the independent C generator
# (Benchmarks/c/frame_load.c), same server, same run: health/check and
# thread/read, closed loop and 32 in flight per connection, at 1 and 16
# connections. make bench-clients. DUR=seconds per point (default 3).
set -euo pipefail
BIN=${BIN:-.build/release}
DUR=${DUR:-3}
source Benchmarks/c_load.sh
(cd Benchmarks/go && GOPROXY=off GOFLAGS=-mod=mod GOTOOLCHAIN=local go build -o "$data/go-bench" .)
(cd clients/typescript && tsc -p .)
"${SERVER_BIN:-$BIN/threadwire-server}" --listen 127.0.0.1:7596 --data-dir "$data/store" --log-level error > "$data/tw.out" 2>&1 &
pids+=($!)
listening tw.out
THREAD=$("$PY" -c "
from threadwire_client import Client
with Client('127.0.0.1', 7596) as c:
    c.initialize('bench-setup')
    print(c.call('thread/start').thread.id)")
READ=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$THREAD'")

printf "method\tconnections\tin flight per connection\tC generator req/s (p50 / p99 µs)\tGo client\tTypeScript client\n"
for method in health read; do
  for c in 1 16; do
    for depth in 1 32; do
      if [ "$method" = health ]; then c_r=$(DEPTH=$depth load 7596 $c "$DUR" "$HEALTH"); else c_r=$(DEPTH=$depth load 7596 $c "$DUR" "$READ" "$INIT"); fi
      go_r=$("$data/go-bench" 127.0.0.1:7596 $c "$DUR" $method $depth "$THREAD")
      ts_r=$(node Benchmarks/typescript/bench.mjs 127.0.0.1:7596 $c "$DUR" $method $depth "$THREAD")
      cr=$(field "$c_r" requests_per_second); gr=$(field "$go_r" requests_per_second); tr=$(field "$ts_r" requests_per_second)
      printf "%s\t%s\t%s\t%s (%s / %s)\t%s (%s / %s) = %s %%\t%s (%s / %s) = %s %%\n" "$method" "$c" "$depth" \
        "$cr" "$(field "$c_r" p50_us)" "$(field "$c_r" p99_us)" \
        "$gr" "$(field "$go_r" p50_us)" "$(field "$go_r" p99_us)" "$(pct "$gr" "$cr")" \
        "$tr" "$(field "$ts_r" p50_us)" "$(field "$ts_r" p99_us)" "$(pct "$tr" "$cr")"
      for x in "$c_r" "$go_r" "$ts_r"; do [ "$(field "$x" errors)" = 0 ] || echo "errors: $x"; done
    done
  done
done
