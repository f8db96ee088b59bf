#!/usr/bin/env bash
# Issue 28, item 1: where the latency tail at CONNECTIONS (16) comes from.
# The C echo and threadwire (default event loops) are each loaded with
# health/check by the C generator while `perf sched record` traces every
# context switch on the machine; then, per group of threads (the server's,
# the generator's), the scheduling delay of each wake-up (from becoming
# runnable to running: time spent waiting for a core) as p50 / p99 / p99.9,
# and the CPU each group used. A request's latency includes its generator
# thread's wait for a core after the answer arrives: when the server keeps
# both cores busy, that wait is the tail the generator reports.
# Needs perf and root (or perf_event_paranoid <= 1). make bench-tail
set -euo pipefail
BIN=${BIN:-.build/release}
DUR=${DUR:-3}
CONNECTIONS=${CONNECTIONS:-16}
command -v perf > /dev/null || { echo "bench-tail needs perf (linux-perf)" >&2; exit 1; }
source Benchmarks/c_load.sh
.build/c/epoll_echo 7591 > "$data/echo.out" &
pids+=($!)
"${SERVER_BIN:-$BIN/threadwire-server}" --listen 127.0.0.1:7592 --data-dir "$data/store" --log-level error > "$data/tw.out" 2>&1 &
pids+=($!)
listening tw.out echo.out

for server in "C echo:7591" "threadwire:7592"; do
  name=${server%%:*}; port=${server##*:}
  load "$port" "$CONNECTIONS" 1 "$HEALTH" > /dev/null
  if ! perf sched record -a -o "$data/sched.data" -- .build/c/frame_load "$port" "$CONNECTIONS" "$DUR" "$HEALTH" > "$data/load.json" 2> "$data/perf.err"; then
    echo "perf sched record failed (root needed?): $(tail -2 "$data/perf.err")" >&2; exit 1
  fi
  echo "$name, $CONNECTIONS connections: $(cat "$data/load.json")"
  # timehist columns: time, cpu, task[tid/pid], wait time, sch delay, run time (ms).
  perf sched timehist -i "$data/sched.data" 2> /dev/null | "$PY" -c '
import collections, re, sys
delays, runtime = collections.defaultdict(list), collections.Counter()
for line in sys.stdin:
    fields = line.split()
    if len(fields) < 6 or not re.match(r"^\d+\.\d+$", fields[0]):
        continue
    group = re.sub(r"\[\d+(/\d+)?\]$", "", fields[2])
    group = "server (NIO event loops)" if group.startswith("NIO-") else group
    try:
        delays[group].append(float(fields[4]) * 1000)
        runtime[group] += float(fields[5])
    except ValueError:
        pass
print("  threads                    wake-ups   sched delay p50 / p99 / p99.9 µs   CPU ms")
for group in sorted(delays, key=lambda g: -runtime[g])[:3]:
    if group == "<idle>":
        continue
    values = sorted(delays[group])
    q = lambda f: values[min(len(values) - 1, int(f * len(values)))]
    print(f"  {group[:26]:26s} {len(values):9d}   {q(.5):6.0f} / {q(.99):6.0f} / {q(.999):6.0f}          {runtime[group]:7.0f}")
'
done
