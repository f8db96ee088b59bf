# Sourced by the PostgreSQL benchmarks (postgres.sh, postgres-ab.sh):
# settings/update driven by the independent C generator
# (Benchmarks/c/frame_load.c). Each connection changes a thread of its own,
# alternating two models so that every request is a change. Needs $root,
# $cli_bin, $port and $seconds; the thread/start calls go through the CLI.
PY=${PY:-$root/.build/venv/bin/python}
mkdir -p "$root/.build/c"
cc -O2 -pthread -o "$root/.build/c/frame_load" "$root/Benchmarks/c/frame_load.c"

frame() {  # python statements filling `e` (an Envelope) -> frame hex
  "$PY" -c "
from threadwire_client import messages
e = messages.envelope.Envelope()
$1
p = e.SerializeToString()
print((b'\x00' + len(p).to_bytes(4, 'big') + p).hex())"
}

# Where the ids of the threads the last run changed go, one per line
# (postgres.sh has pgbench update exactly those rows).
settings_threads_file=${settings_threads_file:-/dev/null}

load_settings_c() {  # connections -> "rps p50 p99" of one run of $seconds on the server at $port
  local connections=$1 first=() second=() thread init requests alternates
  : > "$settings_threads_file"
  for _ in $(seq "$connections"); do
    thread=$("$cli_bin" call --server "127.0.0.1:$port" thread/start --json '{}' | python3 -c "import json,sys; print(json.load(sys.stdin)['thread']['id'])")
    echo "$thread" >> "$settings_threads_file"
    first+=("$(frame "e.request.id = 3; e.request.thread_settings_update.thread_id = '$thread'; e.request.thread_settings_update.model = 'a'")")
    second+=("$(frame "e.request.id = 3; e.request.thread_settings_update.thread_id = '$thread'; e.request.thread_settings_update.model = 'b'")")
  done
  init=$(frame "e.request.id = 1; e.request.initialize.client_info.name = 'frame-load'; e.request.initialize.protocol_version = 1")
  requests=$(IFS=,; echo "${first[*]}"); alternates=$(IFS=,; echo "${second[*]}")
  ALTERNATE_HEX=$alternates "$root/.build/c/frame_load" "$port" "$connections" "$seconds" "$requests" "$init" |
    python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["errors"] == 0, r; print(int(r["requests_per_second"]), r["p50_us"], r["p99_us"])'
}
