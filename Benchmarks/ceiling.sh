#!/usr/bin/env bash
# Issue 10: threadwire against the physical ceiling of its framing on this
# machine, a single-threaded C epoll echo (Benchmarks/c/epoll_echo.c), driven
# by one independent C load generator (Benchmarks/c/frame_load.c: one blocking
# thread per connection, closed loop) for every server, next to the SwiftNIO
# echo of the Benchmarks package (same framing, ByteToMessageHandler) so
# threadwire is reported against both in one run. make bench-ceiling.
set -euo pipefail
BIN=${BIN:-.build/release}
DUR=${DUR:-3}
source Benchmarks/c_load.sh
.build/c/epoll_echo 7591 > "$data/echo.out" &
pids+=($!)
NIO_ECHO_BIN=${NIO_ECHO_BIN:-Benchmarks/.build/release/ThreadwireBench}
"$NIO_ECHO_BIN" echo-server --port 7594 > "$data/nio.out" &
pids+=($!)
"${SERVER_BIN:-$BIN/threadwire-server}" --listen 127.0.0.1:7592 --data-dir "$data/store" --log-level error > "$data/tw.out" 2>&1 &
pids+=($!)
for _ in $(seq 200); do grep -q listening "$data/tw.out" 2>/dev/null && grep -q listening "$data/echo.out" && grep -q listening "$data/nio.out" && break; sleep 0.05; done
grep -q listening "$data/tw.out" 2>/dev/null || { echo "a server did not start (port in use?): $(cat "$data/tw.out")" >&2; exit 1; }; grep -q listening "$data/echo.out" 2>/dev/null || { echo "a server did not start (port in use?): $(cat "$data/echo.out")" >&2; exit 1; }; grep -q listening "$data/nio.out" 2>/dev/null || { echo "a server did not start (port in use?): $(cat "$data/nio.out")" >&2; exit 1; };
THREAD=$("$BIN/threadwire" call --server 127.0.0.1:7592 thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])")
READ=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$THREAD'")

lat() { echo "$(field "$1" p50_us) / $(field "$1" p99_us) / $(field "$1" p99_9_us)"; }
printf "connections\tC echo req/s (p50 / p99 / p99.9 µs)\tNIO echo req/s (p50 / p99 / p99.9 µs)\thealth/check req/s (p50 / p99 / p99.9 µs) = %% of C echo, %% of NIO echo; p99 / echo p99\tthread/read req/s (p50 / p99 / p99.9 µs) = %% of C echo, %% of NIO echo; p99 / echo p99\n"
for c in 1 16 64; do
  echo_r=$(load 7591 $c "$DUR" "$HEALTH")
  nio_r=$(load 7594 $c "$DUR" "$HEALTH")
  health_r=$(load 7592 $c "$DUR" "$HEALTH")
  read_r=$(load 7592 $c "$DUR" "$READ" "$INIT")
  e=$(field "$echo_r" requests_per_second); n=$(field "$nio_r" requests_per_second)
  h=$(field "$health_r" requests_per_second); r=$(field "$read_r" requests_per_second)
  ep99=$(field "$echo_r" p99_us)
  printf "%s\t%s (%s)\t%s (%s)\t%s (%s) = %s %%, %s %%; %sx\t%s (%s) = %s %%, %s %%; %sx\n" "$c" "$e" "$(lat "$echo_r")" \
    "$n" "$(lat "$nio_r")" \
    "$h" "$(lat "$health_r")" "$(pct "$h" "$e")" "$(pct "$h" "$n")" "$("$PY" -c "print(round($(field "$health_r" p99_us)/$ep99, 2))")" \
    "$r" "$(lat "$read_r")" "$(pct "$r" "$e")" "$(pct "$r" "$n")" "$("$PY" -c "print(round($(field "$read_r" p99_us)/$ep99, 2))")"
  for x in "$health_r" "$read_r"; do [ "$(field "$x" errors)" = 0 ] || echo "errors: $x"; done
done

# Pipelined: 32 requests in flight per connection against the closed loop.
printf "\npipelined health/check (32 in flight per connection) against closed loop\n"
for c in 1 16; do
  closed=$(load 7592 $c "$DUR" "$HEALTH")
  piped=$(DEPTH=32 load 7592 $c "$DUR" "$HEALTH")
  a=$(field "$closed" requests_per_second); b=$(field "$piped" requests_per_second)
  printf "%s connections	closed loop %s req/s	pipelined %s req/s = %sx
" "$c" "$a" "$b" "$("$PY" -c "print(round($b/$a, 2))")"
done

# Isolated cores: the same comparison with each server on CPU 0 (threadwire
# with one event loop) and the generator on the other CPUs, so a server's
# CPU no longer delays the generator's threads. On a machine whose cores the
# generator shares, the p99 above is mostly the generator's threads waiting
# for a core (Benchmarks/tail.sh shows it); here it is the server's own.
cpus=$(nproc)
if [ "${PIN:-1}" = 0 ] || [ "$cpus" -lt 2 ] || ! command -v taskset > /dev/null; then
  echo; echo "isolated cores: skipped (PIN=0, fewer than 2 CPUs, or no taskset)"
  exit 0
fi
kill "${pids[@]}" 2> /dev/null || true; wait 2> /dev/null || true; pids=()
taskset -c 0 .build/c/epoll_echo 7591 > "$data/echo-pinned.out" &
pids+=($!)
taskset -c 0 "${SERVER_BIN:-$BIN/threadwire-server}" --event-loops 1 --listen 127.0.0.1:7592 --data-dir "$data/store-pinned" \
  --log-level error > "$data/tw-pinned.out" 2>&1 &
pids+=($!)
for _ in $(seq 200); do grep -q listening "$data/tw-pinned.out" 2>/dev/null && grep -q listening "$data/echo-pinned.out" && break; sleep 0.05; done
grep -q listening "$data/tw-pinned.out" 2>/dev/null || { echo "the pinned server did not start: $(cat "$data/tw-pinned.out")" >&2; exit 1; }
THREAD=$("$BIN/threadwire" call --server 127.0.0.1:7592 thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])")
READ=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$THREAD'")
others=$([ "$cpus" = 2 ] && echo 1 || echo "1-$((cpus - 1))")
printf "\nisolated cores: servers on CPU 0 (threadwire --event-loops 1), generator on CPUs %s\n" "$others"
printf "connections\tC echo req/s (p50 / p99 / p99.9 µs)\thealth/check req/s (p50 / p99 / p99.9 µs) = %% of C echo; p99 / echo p99\tthread/read req/s (p50 / p99 / p99.9 µs) = %% of C echo; p99 / echo p99\n"
for c in 1 16 64; do
  echo_r=$(taskset -c "$others" .build/c/frame_load 7591 $c "$DUR" "$HEALTH")
  health_r=$(taskset -c "$others" .build/c/frame_load 7592 $c "$DUR" "$HEALTH")
  read_r=$(taskset -c "$others" .build/c/frame_load 7592 $c "$DUR" "$READ" "$INIT")
  e=$(field "$echo_r" requests_per_second); h=$(field "$health_r" requests_per_second); r=$(field "$read_r" requests_per_second)
  ep99=$(field "$echo_r" p99_us)
  printf "%s\t%s (%s)\t%s (%s) = %s %%; %sx\t%s (%s) = %s %%; %sx\n" "$c" "$e" "$(lat "$echo_r")" \
    "$h" "$(lat "$health_r")" "$(pct "$h" "$e")" "$("$PY" -c "print(round($(field "$health_r" p99_us)/$ep99, 2))")" \
    "$r" "$(lat "$read_r")" "$(pct "$r" "$e")" "$("$PY" -c "print(round($(field "$read_r" p99_us)/$ep99, 2))")"
  for x in "$health_r" "$read_r"; do [ "$(field "$x" errors)" = 0 ] || echo "errors: $x"; done
done
