#!/usr/bin/env bash
# Issue 29: import rate of a large codex rollout through the server, against
# reading the same file with a JSON parser alone (Python's json, C-accelerated).
# The file: one session of TURNS turns, each a turn_context, a user message, a
# reasoning summary, a function call with a 1 KiB output, a token_count, an
# agent message and a task_complete (about 50 MB at the default 21,000 turns).
# The release server on SQLite (and on PostgreSQL with PG=1), the release CLI
# sending it in 1 MiB pieces; RUNS runs each, median.
# Usage: Benchmarks/import.sh (make bench-import)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server_bin=${SERVER_BIN:-$root/.build/release/threadwire-server}
cli_bin=${CLI_BIN:-$root/.build/release/threadwire}
runs=${RUNS:-3}
turns=${TURNS:-21000}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

python3 - "$work/big.jsonl" "$turns" <<'PY'
import json, sys
path, turns = sys.argv[1], int(sys.argv[2])
def line(i, kind, payload):
    return json.dumps({"timestamp": f"2026-05-01T10:{(i // 60) % 60:02d}:{i % 60:02d}.000Z", "type": kind, "payload": payload})
out = open(path, "w")
out.write(line(0, "session_meta", {"id": "0196b000-0000-7000-8000-000000000001", "timestamp": "2026-05-01T10:00:00.000Z",
                                   "cwd": "/work/app", "multi_agent_version": "v1", "base_instructions": {"text": "You are Codex."}}) + "\n")
output = ("drwxr-xr-x  file " * 64)[:1024]
for t in range(turns):
    tid = f"turn-{t}"
    for kind, payload in (
        ("turn_context", {"turn_id": tid, "cwd": "/work/app", "model": "gpt-5-codex", "multi_agent_version": "v1", "summary": "auto"}),
        ("response_item", {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"step {t}: list the files again"}]}),
        ("response_item", {"type": "reasoning", "summary": [{"type": "summary_text", "text": f"Turn {t}: run ls and report."}]}),
        ("response_item", {"type": "function_call", "name": "shell", "arguments": json.dumps({"command": ["ls", "-la"]}), "call_id": f"c{t}"}),
        ("response_item", {"type": "function_call_output", "call_id": f"c{t}", "output": output}),
        ("event_msg", {"type": "token_count", "info": {"last_token_usage": {"input_tokens": 1000 + t, "output_tokens": 30, "total_tokens": 1030 + t}}}),
        ("response_item", {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"Turn {t}: the listing is above."}]}),
        ("event_msg", {"type": "task_complete", "turn_id": tid}),
    ):
        out.write(line(t, kind, payload) + "\n")
PY
bytes=$(stat -c %s "$work/big.jsonl"); lines=$(wc -l < "$work/big.jsonl")
echo "file: $lines lines, $((bytes / 1000000)) MB ($turns turns)"

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

json_seconds=$(for _ in $(seq "$runs"); do
  python3 -c '
import json, sys, time
start = time.monotonic()
with open(sys.argv[1], "rb") as f:
    for line in f: json.loads(line)
print(time.monotonic() - start)' "$work/big.jsonl"
done | median)

import_run() {  # store flags -> seconds
  local seconds=()
  for run in $(seq "$runs"); do
    rm -rf "$work/data"
    "$server_bin" --listen 127.0.0.1:0 --data-dir "$work/data" --log-level error --max-frame-bytes 4194304 "$@" > "$work/server.out" &
    local pid=$!
    for _ in $(seq 150); do grep -q "listening on" "$work/server.out" 2>/dev/null && break; sleep 0.1; done
    local port; port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$work/server.out" | head -1)
    local start; start=$(date +%s.%N)
    "$cli_bin" import --server "127.0.0.1:$port" "$work/big.jsonl" > "$work/import.out"
    local end; end=$(date +%s.%N)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    echo "$end - $start" | bc
  done | median
}

sqlite_seconds=$(import_run)
tail -1 "$work/import.out"
printf '%-34s | %8s | %12s | %8s\n' "what" "seconds" "lines/s" "MB/s"
for row in "Python json.loads alone:$json_seconds" "thread/import, SQLite:$sqlite_seconds"; do
  name=${row%%:*}; s=${row##*:}
  printf '%-34s | %8.2f | %12.0f | %8.1f\n' "$name" "$s" "$(echo "$lines / $s" | bc -l)" "$(echo "$bytes / 1000000 / $s" | bc -l)"
done
