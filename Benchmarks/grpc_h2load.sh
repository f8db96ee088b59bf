#!/usr/bin/env bash
# Issue 50: threadwire's gRPC listener (--grpc-listen) against a grpc-swift-2
# unary service doing the same work on the same engine and store (the
# Benchmarks package's `grpc-server`), both driven by h2load (nghttp2's C
# HTTP/2 load generator: one request in flight per connection, gRPC framing
# from a body file), so neither side is judged through a Swift client's own
# cost. Medians of ROUNDS interleaved rounds; server CPU per request (user +
# system from /proc over each run). make bench-grpc.
set -euo pipefail
BIN=${BIN:-.build/release}
DUR=${DUR:-3}
ROUNDS=${ROUNDS:-3}
PEER_BIN=${PEER_BIN:-Benchmarks/.build/release/ThreadwireBench}
source Benchmarks/c_load.sh
command -v h2load > /dev/null || { echo "h2load is missing (apt-get install nghttp2-client)" >&2; exit 1; }
"$BIN/threadwire-server" --listen 127.0.0.1:7720 --grpc-listen 127.0.0.1:7721 --data-dir "$data/tw" --log-level error > "$data/tw.out" 2>&1 &
pids+=($!); tw_pid=$!
"$PEER_BIN" grpc-server --port 7722 --data-dir "$data/peer" > "$data/peer.out" 2>&1 &
pids+=($!); peer_pid=$!
listening tw.out peer.out
for _ in $(seq 100); do grep -q "grpc on" "$data/tw.out" && break; sleep 0.05; done
# A thread on each, and each ThreadRead's body: one gRPC message (flag, length, ThreadReadParams).
bodies=$("$PY" - <<'PY'
import grpc
from threadwire_client import messages
T = messages.thread
def start(target, method):
    call = grpc.insecure_channel(target).unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    return T.ThreadLifecycleResult.FromString(call(b"", timeout=10)).thread.id
for target, method in (("127.0.0.1:7721", "/threadwire.v1.Threadwire/ThreadStart"), ("127.0.0.1:7722", "/threadwire.bench.Peer/ThreadStart")):
    p = T.ThreadReadParams(thread_id=start(target, method)).SerializeToString()
    print((b"\0" + len(p).to_bytes(4, "big") + p).hex())
PY
)
printf '\0\0\0\0\0' > "$data/health.bin"
echo "${bodies%%$'\n'*}" | xxd -r -p > "$data/read-tw.bin"
echo "${bodies##*$'\n'}" | xxd -r -p > "$data/read-peer.bin"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # pid, url, body, connections -> "req/s cpu_us"
  local t0 t1 out
  t0=$(ticks "$1")
  out=$(h2load -c "$4" -m 1 -D "$DUR" -d "$3" -H 'content-type: application/grpc' -H 'te: trailers' "$2")
  t1=$(ticks "$1")
  echo "$out" | grep -q " 0 failed, 0 errored" || { echo "h2load saw failures: $out" >&2; exit 1; }
  "$PY" -c "
import re, sys
rps = float(re.search(r'finished in [0-9.]+s, ([0-9.]+) req/s', sys.argv[1]).group(1))
print(rps, round(($t1 - $t0) * 1e6 / $(getconf CLK_TCK) / (rps * $DUR), 1))" "$out"
}
declare -A results
for c in 1 16 64; do
  for round in $(seq "$ROUNDS"); do
    for method in HealthCheck ThreadRead; do
      tw_body=$data/health.bin; peer_body=$data/health.bin
      [ $method = ThreadRead ] && { tw_body=$data/read-tw.bin; peer_body=$data/read-peer.bin; }
      results[tw,$method,$c]+="$(run $tw_pid http://127.0.0.1:7721/threadwire.v1.Threadwire/$method "$tw_body" $c);"
      results[peer,$method,$c]+="$(run $peer_pid http://127.0.0.1:7722/threadwire.bench.Peer/$method "$peer_body" $c);"
    done
  done
done
printf "method\tconnections\tthreadwire --grpc-listen req/s (CPU µs/request)\tgrpc-swift-2 service req/s (CPU µs/request)\tthreadwire / grpc-swift-2\n"
for method in HealthCheck ThreadRead; do
  for c in 1 16 64; do
    "$PY" - "$method" "$c" "${results[tw,$method,$c]}" "${results[peer,$method,$c]}" <<'PY'
import statistics, sys
method, c, tw, peer = sys.argv[1:]
rows = lambda s: [list(map(float, r.split())) for r in s.strip(";").split(";")]
t, p = rows(tw), rows(peer)
med = lambda rs, i: statistics.median(r[i] for r in rs)
ratios = [a[0] / b[0] for a, b in zip(t, p)]
print(f"{method}\t{c}\t{med(t,0):.0f} ({med(t,1):.1f})\t{med(p,0):.0f} ({med(p,1):.1f})\t{statistics.median(ratios):.2f}x (rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
PY
  done
done
