#!/usr/bin/env bash
# Issue 11: cost of TLS and of authentication. The release server, one config
# at a time, loaded by the release CLI's closed-loop generator (`threadwire
# bench`, the same generator and client for every config):
#   plain   no TLS, no authentication
#   tokens  bearer tokens (initialize authenticates; nothing per request after)
#   tls     TLS 1.3 (swift-nio-ssl / BoringSSL) with tokens
#   mtls    mutual TLS: the client certificate names the principal
# health/check and thread/read at 16 and 64 connections, median of RUNS runs
# of SECONDS each. Usage: Benchmarks/security.sh (make bench-security)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${SERVER_BIN:-$root/.build/release/threadwire-server}
cli_bin=${CLI_BIN:-$root/.build/release/threadwire}
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-3}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
bash "$root/integration/make_test_certs.sh" "$work/certs" >/dev/null
token=bench-token-0123456789abcdef
echo "bench $token" > "$work/tokens"
chmod 600 "$work/tokens"

start() {  # name, server flags...
  local name=$1; shift
  # The cost of the transport and of authentication, not of quotas (whose
  # defaults with authentication would refuse past 1000 requests a second;
  # make bench-quotas measures them).
  "$server_bin" --listen 127.0.0.1:0 --data-dir "$work/data-$name" --log-level error --max-requests-per-second 0 "$@" > "$work/$name.out" &
  server_pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$work/$name.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "listening on" "$work/$name.out" || { echo "server $name did not start" >&2; exit 1; }
  port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$work/$name.out" | head -1)
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

measure() {  # workload connections client-flags...
  local workload=$1 connections=$2; shift 2
  for _ in $(seq "$runs"); do
    "$cli_bin" bench --server "127.0.0.1:$port" --workload "$workload" --connections "$connections" \
      --duration "$seconds" --json "$@" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["throughput_per_second"]))'
  done | median
}

declare -A result
for config in plain tokens tls mtls; do
  client=()
  case $config in
    plain) start plain ;;
    tokens) start tokens --auth-tokens "$work/tokens"; client=(--auth-token "$token") ;;
    tls) start tls --auth-tokens "$work/tokens" --tls-cert "$work/certs/server.pem" --tls-key "$work/certs/server.key"
         client=(--auth-token "$token" --tls-ca "$work/certs/ca.pem") ;;
    mtls) start mtls --tls-cert "$work/certs/server.pem" --tls-key "$work/certs/server.key" --tls-client-ca "$work/certs/ca.pem"
          client=(--tls-ca "$work/certs/ca.pem" --tls-cert "$work/certs/alice.pem" --tls-key "$work/certs/alice.key") ;;
  esac
  for workload in health read; do
    for connections in 16 64; do
      result[$config,$workload,$connections]=$(measure $workload $connections "${client[@]}")
    done
  done
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true
done

printf '\n| workload | connections | plain req/s | tokens req/s (vs plain) | TLS req/s (vs plain) | mutual TLS req/s (vs plain) |\n|---|---|---|---|---|---|\n'
for workload in health read; do
  for connections in 16 64; do
    p=${result[plain,$workload,$connections]}
    row="| $workload | $connections | $p"
    for config in tokens tls mtls; do
      v=${result[$config,$workload,$connections]}
      row="$row | $v ($(python3 -c "print(f'{$v/$p*100:.0f} %')"))"
    done
    echo "$row |"
  done
done
