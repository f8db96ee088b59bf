#!/usr/bin/env bash
# Issue 24: a 10,000-turn thread with and without compaction; thread/list
# search over 100,000 threads on SQLite and on a throwaway PostgreSQL.
# Usage: Benchmarks/context.sh [context.py options]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/Benchmarks/pg-cluster.sh"
"$root/.build/venv/bin/python" "$root/Benchmarks/context.py" "$root/.build/release/threadwire-server" \
  --postgres "postgres://threadwire@127.0.0.1:$pgport/tw" "$@"
