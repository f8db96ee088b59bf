# Sourced by the scripts that drive servers with the C load generator
# (ceiling.sh, compare.sh): builds the C echo and the generator, defines
# frame() and the frames every run sends, and a temporary folder whose
# servers (pids) are stopped and removed at exit.
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
