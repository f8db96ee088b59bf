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
pids+=($!)
"$B_BIN" --listen 127.0.0.1:7683 --data-dir "$data/b" --log-level error > "$data/b.out" 2>&1 &
pids+=($!)
listening a.out b.out echo.out
thread() { "$CLI" call --server "127.0.0.1:$1" thread/start --json '{}' | "$PY" -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])"; }
READ_A=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$(thread 7682)'")
READ_B=$(frame "e.request.id = 2; e.request.thread_read.thread_id = '$(thread 7683)'")

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf "connections\tC echo req/s\thealth/check A\thealth/check B\tthread/read A\tthread/read B\t(medians of %s rounds of %s s; %% of the C echo)\n" "$ROUNDS" "$DUR"
for c in 1 16 64; do
  e=(); ha=(); hb=(); ra=(); rb=()
  for _ in $(seq "$ROUNDS"); do
    e+=("$(field "$(load 7681 $c "$DUR" "$HEALTH")" requests_per_second)")
    ha+=("$(field "$(load 7682 $c "$DUR" "$HEALTH")" requests_per_second)")
    hb+=("$(field "$(load 7683 $c "$DUR" "$HEALTH")" requests_per_second)")
    ra+=("$(field "$(load 7682 $c "$DUR" "$READ_A" "$INIT")" requests_per_second)")
    rb+=("$(field "$(load 7683 $c "$DUR" "$READ_B" "$INIT")" requests_per_second)")
  done
  E=$(median "${e[@]}"); HA=$(median "${ha[@]}"); HB=$(median "${hb[@]}"); RA=$(median "${ra[@]}"); RB=$(median "${rb[@]}")
  printf "%s\t%s\t%s (%s %%)\t%s (%s %%)\t%s (%s %%)\t%s (%s %%)\n" "$c" "$E" \
    "$HA" "$(pct "$HA" "$E")" "$HB" "$(pct "$HB" "$E")" "$RA" "$(pct "$RA" "$E")" "$RB" "$(pct "$RB" "$E")"
done
