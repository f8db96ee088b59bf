#!/usr/bin/env bash
# Two builds paired round by round, for differences smaller than this host's
# run-to-run spread (two servers of the same build differed by 20 % in
# median CPU per request over 8 rounds here). Each on a core of its own
# (CPU 0, one event loop; the C generator on CPU 1), health/check and
# thread/read at CONNS connections, ROUNDS rounds of DUR seconds, A then B
# in odd rounds and B then A in even ones. Prints each build's median server
# CPU per request (user + system, from /proc over the run), the median of
# the paired differences (B - A) and in how many rounds B was lower; then the
# same for user time alone, which the kernel's varying cost of waking the
# client does not move.
# A_BIN=B_BIN measures the noise itself.
#   A_BIN=/path/to/old/threadwire-server B_BIN=.build/release/threadwire-server \
#     CLI=.build/release/threadwire Benchmarks/paired-ab.sh
set -euo pipefail
A_BIN=${A_BIN:?the threadwire-server binary of build A}
B_BIN=${B_BIN:-.build/release/threadwire-server}
CLI=${CLI:-.build/release/threadwire}
DUR=${DUR:-2}
ROUNDS=${ROUNDS:-12}
source Benchmarks/c_load.sh
taskset -c 0 "$A_BIN" --event-loops 1 --listen 127.0.0.1:7691 --data-dir "$data/a" --log-level error > "$data/a.out" 2>&1 &
a_pid=$!; pids+=($a_pid)
taskset -c 0 "$B_BIN" --event-loops 1 --listen 127.0.0.1:7692 --data-dir "$data/b" --log-level error > "$data/b.out" 2>&1 &
b_pid=$!; pids+=($b_pid)
listening a.out b.out
thread() { "$CLI" call --server "127.0.0.1:$1" thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])"; }
READ_A=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$(thread 7691)'")
READ_B=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$(thread 7692)'")
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
# One run against server `pid` on `port`: its CPU µs per request as "total/user".
cpu_per_request() {
  local pid=$1 port=$2; shift 2
  local u0 s0 u1 s1 out
  read -r u0 s0 < <(ticks "$pid")
  out=$(taskset -c 1 .build/c/frame_load "$port" "$@")
  read -r u1 s1 < <(ticks "$pid")
  "$PY" -c "
import json, sys
r = json.loads(sys.argv[1]); per = 1e6 / $(getconf CLK_TCK) / (r['requests_per_second'] * $DUR)
print('%.2f/%.2f' % (($u1 - $u0 + $s1 - $s0) * per, ($u1 - $u0) * per))" "$out"
}
for c in ${CONNS:-16 64}; do
  for method in health/check thread/read; do
    a=(); b=()
    if [ $method = health/check ]; then fa=$HEALTH; fb=$HEALTH; setup=(); else fa=$READ_A; fb=$READ_B; setup=("$INIT"); fi
    for round in $(seq "$ROUNDS"); do
      if (( round % 2 )); then
        a+=("$(cpu_per_request $a_pid 7691 "$c" "$DUR" "$fa" "${setup[@]}")"); b+=("$(cpu_per_request $b_pid 7692 "$c" "$DUR" "$fb" "${setup[@]}")")
      else
        b+=("$(cpu_per_request $b_pid 7692 "$c" "$DUR" "$fb" "${setup[@]}")"); a+=("$(cpu_per_request $a_pid 7691 "$c" "$DUR" "$fa" "${setup[@]}")")
      fi
    done
    "$PY" -c "
import statistics, sys
runs = [[[float(v) for v in x.split('/')] for x in arg.split()] for arg in sys.argv[1:3]]
for index, kind in enumerate(['total', 'user']):
    a = [run[index] for run in runs[0]]; b = [run[index] for run in runs[1]]
    d = [y - x for x, y in zip(a, b)]
    print(f'$c connections, $method, {kind}: A {statistics.median(a):.1f} µs, B {statistics.median(b):.1f} µs per request; '
          f'paired B - A median {statistics.median(d):+.2f} µs, B lower in {sum(x < 0 for x in d)} of {len(d)} rounds')" "${a[*]}" "${b[*]}"
  done
done
