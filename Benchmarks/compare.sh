#!/usr/bin/env bash
# Two threadwire builds side by side in one run, against the C epoll echo
# (same framing) and with one independent C load generator for all three:
# health/check and thread/read at 1, 16 and 64 connections, ROUNDS
# interleaved rounds (echo, A, B each round), medians reported.
#
#   A_BIN=/path/to/old/threadwire-server B_BIN=.build/release/threadwire-server \
#     Benchmarks/compare.sh
#
# The CLI that creates the thread to read is B's (.build/release/threadwire).
# PIN=1: every server on CPU 0 (threadwire with one event loop), the
# generator on CPU 1: each server's cost on a core of its own.
# CPU per request is printed as total (user + system).
# CONNECTIONS="16 64" measures only those connection counts.
# FLOOR_BIN=.../ThreadwireBench adds SwiftNIO's floor (`echo-server --raw`)
# as a column, measured with health/check's frames like the C echo.
set -euo pipefail
A_BIN=${A_BIN:?the threadwire-server binary of build A}
B_BIN=${B_BIN:-.build/release/threadwire-server}
CLI=${CLI:-.build/release/threadwire}
DUR=${DUR:-3}
ROUNDS=${ROUNDS:-3}
source Benchmarks/c_load.sh
SERVER=(); GENERATOR=(); LOOPS=()
if [ "${PIN:-0}" = 1 ]; then SERVER=(taskset -c 0); GENERATOR=(taskset -c 1); LOOPS=(--event-loops 1); fi
load() { "${GENERATOR[@]}" .build/c/frame_load "$@"; }
"${SERVER[@]}" .build/c/epoll_echo 7681 > "$data/echo.out" &
echo_pid=$!
pids+=($echo_pid)
"${SERVER[@]}" "$A_BIN" "${LOOPS[@]}" --listen 127.0.0.1:7682 --data-dir "$data/a" --log-level error > "$data/a.out" 2>&1 &
a_pid=$!
pids+=($a_pid)
"${SERVER[@]}" "$B_BIN" "${LOOPS[@]}" --listen 127.0.0.1:7683 --data-dir "$data/b" --log-level error > "$data/b.out" 2>&1 &
b_pid=$!
pids+=($b_pid)
listening a.out b.out echo.out
# FLOOR_BIN: SwiftNIO's floor beside them (Benchmarks' ThreadwireBench,
# `echo-server --raw`: each read's bytes written back, flushed per read).
floor_pid=
if [ -n "${FLOOR_BIN:-}" ]; then
  "${SERVER[@]}" "$FLOOR_BIN" echo-server --raw --port 7684 "${LOOPS[@]}" > "$data/floor.out" &
  floor_pid=$!
  pids+=($floor_pid)
  listening floor.out
fi
thread() { "$CLI" call --server "127.0.0.1:$1" thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])"; }
READ_A=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$(thread 7682)'")
READ_B=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$(thread 7683)'")

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# One run against server `pid`: "requests/s µs-of-server-CPU-per-request"
# as "total (user + system)", all its threads, from /proc, over the run.
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
measured() {
  local pid=$1; shift
  local u0 s0 u1 s1 out
  read -r u0 s0 < <(ticks "$pid")
  out=$(load "$@")
  read -r u1 s1 < <(ticks "$pid")
  "$PY" -c "
rps = $(field "$out" requests_per_second); per = 1e6 / $(getconf CLK_TCK) / (rps * $DUR)
user, system = ($u1 - $u0) * per, ($s1 - $s0) * per
print(rps, '%.1f(%.1f+%.1f)' % (user + system, user, system))"
}
# The median of "total(user+system)" values, by total.
median_cpu() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}' | sed 's/(\(.*\)+\(.*\))/ (\1 + \2)/'; }

floor_column=""; [ -n "$floor_pid" ] && floor_column="NIO floor\t"
printf "connections\tC echo\t${floor_column}health/check A\thealth/check B\tthread/read A\tthread/read B\t(req/s, %% of the C echo, server CPU per request in µs as total (user + system); medians of %s rounds of %s s)\n" "$ROUNDS" "$DUR"
for c in ${CONNECTIONS:-1 16 64}; do
  f=(); cf=(); e=(); ce=(); ha=(); hb=(); ra=(); rb=(); cha=(); chb=(); cra=(); crb=()
  for _ in $(seq "$ROUNDS"); do
    read -r r u < <(measured "$echo_pid" 7681 $c "$DUR" "$HEALTH"); e+=("$r"); ce+=("$u")
    if [ -n "$floor_pid" ]; then read -r r u < <(measured "$floor_pid" 7684 $c "$DUR" "$HEALTH"); f+=("$r"); cf+=("$u"); fi
    read -r r u < <(measured "$a_pid" 7682 $c "$DUR" "$HEALTH"); ha+=("$r"); cha+=("$u")
    read -r r u < <(measured "$b_pid" 7683 $c "$DUR" "$HEALTH"); hb+=("$r"); chb+=("$u")
    read -r r u < <(measured "$a_pid" 7682 $c "$DUR" "$READ_A" "$INIT"); ra+=("$r"); cra+=("$u")
    read -r r u < <(measured "$b_pid" 7683 $c "$DUR" "$READ_B" "$INIT"); rb+=("$r"); crb+=("$u")
  done
  E=$(median "${e[@]}"); HA=$(median "${ha[@]}"); HB=$(median "${hb[@]}"); RA=$(median "${ra[@]}"); RB=$(median "${rb[@]}")
  floor_cell=""
  [ -n "$floor_pid" ] && floor_cell="$(median "${f[@]}") ($(pct "$(median "${f[@]}")" "$E") %) $(median_cpu "${cf[@]}") µs	"
  printf "%s\t%s %s µs\t%s%s (%s %%) %s µs\t%s (%s %%) %s µs\t%s (%s %%) %s µs\t%s (%s %%) %s µs\n" "$c" "$E" "$(median_cpu "${ce[@]}")" \
    "$floor_cell" "$HA" "$(pct "$HA" "$E")" "$(median_cpu "${cha[@]}")" "$HB" "$(pct "$HB" "$E")" "$(median_cpu "${chb[@]}")" \
    "$RA" "$(pct "$RA" "$E")" "$(median_cpu "${cra[@]}")" "$RB" "$(pct "$RB" "$E")" "$(median_cpu "${crb[@]}")"
done
