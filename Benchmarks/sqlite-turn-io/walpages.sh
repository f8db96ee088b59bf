#!/usr/bin/env bash
# Issue 49: which b-trees a workload's WAL frames belong to. Runs 3 s of the
# workload, kills the server (-9, so the WAL stays), then maps each frame's
# page to its table or index with SQLite's dbstat on a copy of the store.
# Usage: Benchmarks/sqlite-turn-io/walpages.sh SERVER_BIN [turn|settings]
set -euo pipefail
. "$(dirname "$0")/common.sh"
workload=${2:-turn}
start_warm "$1" "$workload"
bench_rps "$workload" 3 > /dev/null
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
python3 - "$dir/store/threadwire.sqlite" <<'PY'
import collections, shutil, sqlite3, struct, sys
db = sys.argv[1]
data = open(db + '-wal', 'rb').read()
page_size = struct.unpack('>I', data[8:12])[0]
frames, commits, offset = [], 0, 32
while offset + 24 + page_size <= len(data):
    page, commit = struct.unpack('>II', data[offset:offset + 8])
    frames.append(page); commits += bool(commit); offset += 24 + page_size
shutil.copy(db, db + '.copy'); shutil.copy(db + '-wal', db + '.copy-wal')
owner = {page: name for name, page in sqlite3.connect(db + '.copy').execute('SELECT name, pageno FROM dbstat')}
print(f'{len(frames)} frames in the WAL, {commits} commits, {len(frames) / max(1, commits):.1f} frames per commit')
for name, count in collections.Counter(owner.get(p, '?') for p in frames).most_common():
    print(f'{count:7d} {100 * count / len(frames):5.1f}%  {name}')
PY
rm -rf "$dir"
