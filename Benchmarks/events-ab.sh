#!/usr/bin/env bash
# Issue 49: what keeping each thread's events costs. Build A (before
# events) and build B side by side, on SQLite and on PostgreSQL (fsync on),
# ROUNDS interleaved rounds (A then B each round, each on a fresh store):
# thread/settings/update (one kept event per change) and turn (turn/start to
# turn/completed; six kept events per turn) at 16 connections, SECONDS_PER_RUN
# each. Prints per build and store the median req/s and the server's CPU per
# request (user + system from /proc over the run), and B/A.
# Usage: A_BIN=/path/to/old/threadwire-server Benchmarks/events-ab.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
a_bin=${A_BIN:?the threadwire-server binary of build A}
b_bin=${B_BIN:-$root/.build/release/threadwire-server}
cli_bin=${CLI_BIN:-$root/.build/release/threadwire}
rounds=${ROUNDS:-3}
seconds=${SECONDS_PER_RUN:-3}
runs=1
. "$root/Benchmarks/pg-cluster.sh"
. "$root/Benchmarks/cli_load.sh"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

declare -A rps cpu
for round in $(seq "$rounds"); do
  for store in ${STORES:-sqlite postgres}; do
    for build in a b; do
      name=$store-$build-$round
      server_bin=$a_bin; [ $build = b ] && server_bin=$b_bin
      flags=()
      if [ $store = postgres ]; then
        "$pgbin/createdb" -h 127.0.0.1 -p "$pgport" -U threadwire "e$round$build"
        flags+=(--store "postgres://threadwire@127.0.0.1:$pgport/e$round$build")
      fi
      start_server "$name" "${flags[@]}"
      for workload in settings turn; do
        t0=$(ticks "$server_pid")
        read -r r _ _ <<< "$(measure $workload 16)"
        t1=$(ticks "$server_pid")
        rps[$store,$build,$workload]+="$r "
        cpu[$store,$build,$workload]+="$(python3 -c "print(round(($t1-$t0)/$hz*1e6/max(1,$r*$seconds), 1))") "
      done
      kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
    done
  done
done

med() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# The median of each round's B/A: A and B of one round run back to back,
# so a machine that drifts over the rounds moves both.
paired() { python3 -c "import statistics, sys; a, b = sys.argv[1].split(), sys.argv[2].split(); print(f'{statistics.median(float(y) / float(x) for x, y in zip(a, b)):.3f}')" "$1" "$2"; }
printf '%-9s %-9s %10s %10s %7s %7s %12s %12s %7s %7s\n' store workload "A req/s" "B req/s" "B/A" paired "A CPU µs/rq" "B CPU µs/rq" "B/A" paired
for store in ${STORES:-sqlite postgres}; do
  for workload in settings turn; do
    ra=$(echo "${rps[$store,a,$workload]}" | med); rb=$(echo "${rps[$store,b,$workload]}" | med)
    ca=$(echo "${cpu[$store,a,$workload]}" | med); cb=$(echo "${cpu[$store,b,$workload]}" | med)
    printf '%-9s %-9s %10s %10s %7s %7s %12s %12s %7s %7s\n' $store $workload "$ra" "$rb" "$(python3 -c "print(f'{$rb/$ra:.3f}')")" \
      "$(paired "${rps[$store,a,$workload]}" "${rps[$store,b,$workload]}")" \
      "$ca" "$cb" "$(python3 -c "print(f'{$cb/$ca:.3f}')")" "$(paired "${cpu[$store,a,$workload]}" "${cpu[$store,b,$workload]}")"
  done
done
for key in "${!rps[@]}"; do echo "req/s $key: ${rps[$key]}"; done | sort
for key in "${!cpu[@]}"; do echo "CPU µs/request $key: ${cpu[$key]}"; done | sort
