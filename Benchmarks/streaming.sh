#!/usr/bin/env bash
# Issue 13: the latency threadwire adds between a provider's streamed chunk and
# the client's item/agent_message/delta, and the server's memory per streaming
# turn. A fake OpenAI-compatible provider (Tests/provider/fake_openai.py)
# streams CHUNKS chunks per answer, one every DELAY_MS, each stamped with its
# wall-clock send time; the release server relays them; the benchmark client
# (ThreadwireBench streaming) runs TURNS concurrent turns (one thread each)
# over CONNECTIONS connections and subtracts the stamp from its receive time.
# Provider, server and client share this machine's cores.
# Usage: Benchmarks/streaming.sh   (make bench-streaming)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${SERVER_BIN:-$root/.build/release/threadwire-server}
bench_bin=$root/Benchmarks/.build/release/ThreadwireBench
turns=${TURNS:-200}; connections=${CONNECTIONS:-50}; chunks=${CHUNKS:-50}; delay=${DELAY_MS:-20}
work=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

python3 -u "$root/Tests/provider/fake_openai.py" > "$work/provider.out" &
for _ in $(seq 100); do grep -q listening "$work/provider.out" 2>/dev/null && break; sleep 0.1; done
provider_port=$(awk '{print $2}' "$work/provider.out")
python3 - "$provider_port" "$chunks" "$delay" <<'PY'
import json, sys, urllib.request
port, chunks, delay = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
chunk = lambda delta, finish=None: json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
events = [{"delay_ms": delay, "data": chunk({"content": "ts={ts};"})} for _ in range(chunks)]
events.append({"data": chunk({}, "stop")})
request = urllib.request.Request(f"http://127.0.0.1:{port}/control/default",
                                 data=json.dumps({"events": events, "echo_timestamps": True}).encode(), method="POST")
urllib.request.urlopen(request).read()
PY
cat > "$work/config.json" <<JSON
{"model_providers": [{"name": "fake", "base_url": "http://127.0.0.1:$provider_port/v1", "stream_idle_timeout_ms": 30000}],
 "models": [{"slug": "remote-1", "provider": "fake"}],
 "limits": {"max_running_turns": 0}}
JSON
"$server_bin" --listen 127.0.0.1:0 --data-dir "$work/data" --config "$work/config.json" --log-level error > "$work/server.out" &
server_pid=$!
for _ in $(seq 150); do grep -q "listening on" "$work/server.out" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$work/server.out" | head -1)
echo "turns $turns over $connections connections; $chunks chunks per answer, one every $delay ms"
cpu() { awk '{print $14 + $15}' "/proc/$server_pid/stat"; }
before=$(cpu)
"$bench_bin" streaming --server "127.0.0.1:$port" --connections "$connections" --turns "$turns" --server-pid "$server_pid" | tee "$work/bench.out"
deltas=$(sed -n 's/.*deltas \([0-9]*\) in.*/\1/p' "$work/bench.out")
echo "server CPU: $(python3 -c "print(f'{($(cpu) - $before) / $(getconf CLK_TCK):.2f} s, {($(cpu) - $before) / $(getconf CLK_TCK) / $deltas * 1e6:.0f} us per delta (whole turn included)')")"
