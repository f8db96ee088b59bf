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
set -euo pipefail
A_BIN=${A_BIN:?the threadwire-server binary of build A}
B_BIN=${B_BIN:-.build/release/threadwire-server}
CLI=${CLI:-.build/release/threadwire}
DUR=${DUR:-3}
ROUNDS=${ROUNDS:-3}
source Benchmarks/c_load.sh
.build/c/epoll_echo 7681 > "$data/echo.out" &
pids+=($!)
"$A_BIN" --listen 127.0.0.1:7682 --data-dir "$data/a" --log-level error > "$data/a.out" 2>&1 &
a_pid=$!
pids+=($a_pid)
"$B_BIN" --listen 127.0.0.1:7683 --data-dir "$data/b" --log-level error > "$data/b.out" 2>&1 &
b_pid=$!
pids+=($b_pid)
listening a.out b.out echo.out
thread() { "$CLI" call --server "127.0.0.1:$1" thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])"; }
READ_A=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$(thread 7682)'")
READ_B=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$(thread 7683)'")

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# One run against server `pid`: "requests/s µs-of-server-CPU-per-request"
# (user + system of all its threads, from /proc, over the run).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
measured() {
  local pid=$1; shift
  local t0 t1 out
  t0=$(ticks "$pid")
  out=$(load "$@")
  t1=$(ticks "$pid")
  "$PY" -c "
rps = $(field "$out" requests_per_second)
print(rps, '%.1f' % (($t1 - $t0) * 1e6 / $(getconf CLK_TCK) / (rps * $DUR)))"
}

printf "connections\tC echo req/s\thealth/check A\thealth/check B\tthread/read A\tthread/read B\t(req/s, %% of the C echo, server CPU per request in µs; medians of %s rounds of %s s)\n" "$ROUNDS" "$DUR"
for c in 1 16 64; do
  e=(); ha=(); hb=(); ra=(); rb=(); cha=(); chb=(); cra=(); crb=()
  for _ in $(seq "$ROUNDS"); do
    e+=("$(field "$(load 7681 $c "$DUR" "$HEALTH")" requests_per_second)")
    read -r r u < <(measured "$a_pid" 7682 $c "$DUR" "$HEALTH"); ha+=("$r"); cha+=("$u")
    read -r r u < <(measured "$b_pid" 7683 $c "$DUR" "$HEALTH"); hb+=("$r"); chb+=("$u")
    read -r r u < <(measured "$a_pid" 7682 $c "$DUR" "$READ_A" "$INIT"); ra+=("$r"); cra+=("$u")
    read -r r u < <(measured "$b_pid" 7683 $c "$DUR" "$READ_B" "$INIT"); rb+=("$r"); crb+=("$u")
  done
  E=$(median "${e[@]}"); HA=$(median "${ha[@]}"); HB=$(median "${hb[@]}"); RA=$(median "${ra[@]}"); RB=$(median "${rb[@]}")
  printf "%s\t%s\t%s (%s %%) %s µs\t%s (%s %%) %s µs\t%s (%s %%) %s µs\t%s (%s %%) %s µs\n" "$c" "$E" \
    "$HA" "$(pct "$HA" "$E")" "$(median "${cha[@]}")" "$HB" "$(pct "$HB" "$E")" "$(median "${chb[@]}")" \
    "$RA" "$(pct "$RA" "$E")" "$(median "${cra[@]}")" "$RB" "$(pct "$RB" "$E")" "$(median "${crb[@]}")"
done
