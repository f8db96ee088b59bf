# Sourced by the scripts that drive servers with the C load generator
# (ceiling.sh, compare.sh): builds the C echo and the generator, defines
# frame() and the frames every run sends, and a temporary folder whose
# servers (pids) are stopped and removed at exit, and listening() to wait for them.
PY=${PY:-.build/venv/bin/python}
mkdir -p .build/c
cc -O2 -pthread -o .build/c/epoll_echo Benchmarks/c/epoll_echo.c
cc -O2 -pthread -o .build/c/frame_load Benchmarks/c/frame_load.c

frame() {  # python statements filling `e` (an Envelope) -> frame hex
  "$PY" -c "
from threadwire_client import messages
e = messages.envelope.Envelope()
$1
p = e.SerializeToString()
print((b'\x00' + len(p).to_bytes(4, 'big') + p).hex())"
}
HEALTH=$(frame "e.request.id = 1; e.request.health_check.SetInParent()")
INIT=$(frame "e.request.id = 1; e.request.initialize.client_info.name = 'frame-load'; e.request.initialize.protocol_version = 1")

data=$(mktemp -d)
pids=()
trap 'kill ${pids[@]} 2>/dev/null; wait 2>/dev/null; rm -rf "$data"' EXIT
load() { .build/c/frame_load "$@"; }
field() { "$PY" -c "import json,sys; r=json.loads(sys.argv[1]); print(r['$2'])" "$1"; }
pct() { "$PY" -c "print(round(100*$1/$2))"; }
# Waits up to 10 s for each server's output file under $data to say it is
# listening; stops the script with that output if one does not.
listening() {
  local f ready
  for _ in $(seq 200); do
    ready=1
    for f in "$@"; do grep -q listening "$data/$f" 2>/dev/null || { ready=0; break; }; done
    [ "$ready" = 1 ] && return 0
    sleep 0.05
  done
  for f in "$@"; do grep -q listening "$data/$f" 2>/dev/null || { echo "a server did not start (port in use?): $(cat "$data/$f")" >&2; exit 1; }; done
}
