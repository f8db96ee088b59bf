#!/usr/bin/env python3
"""Issue 49: the SQLite layout of kept events, modelled without the server.

16 threads take turns of 6 kept events each (rows of 450 bytes, about what
item and turn notifications weigh); each event kind is one group commit
over the 16 threads, as the server's commit queue groups concurrent turns.
Prints the WAL frames written per thread and turn, and the time per thread
and turn (synchronous=FULL, so each commit syncs), for the two layouts:
  - v9: WITHOUT ROWID, clustered by (thread_id, seq);
  - v10: appended in commit order (rowid), a unique index on (thread_id, seq).

Usage: python3 Benchmarks/events_layout_sqlite.py
"""
import os
import sqlite3
import tempfile
import time
import uuid

LAYOUTS = {
    "v9 (clustered by thread)": """CREATE TABLE thread_events (thread_id TEXT NOT NULL, seq INTEGER NOT NULL,
        created_at INTEGER NOT NULL, record BLOB NOT NULL, PRIMARY KEY (thread_id, seq)) WITHOUT ROWID;""",
    "v10 (appended, indexed)": """CREATE TABLE thread_events (thread_id TEXT NOT NULL, seq INTEGER NOT NULL,
        created_at INTEGER NOT NULL, record BLOB NOT NULL);
        CREATE UNIQUE INDEX thread_events_by_thread ON thread_events (thread_id, seq);""",
}


def run(schema, threads=16, turns=200, events=6, size=450):
    path = os.path.join(tempfile.mkdtemp(prefix="tw-layout-"), "events.sqlite")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")  # the WAL's size counts every frame written
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(schema)
    ids = [str(uuid.uuid4()) for _ in range(threads)]
    seq = 0
    record = os.urandom(size)
    started = time.perf_counter()
    for _ in range(turns):
        for _ in range(events):
            seq += 1
            db.execute("BEGIN")
            for thread in ids:
                db.execute("INSERT INTO thread_events (thread_id, seq, created_at, record) VALUES (?, ?, 0, ?)",
                           (thread, seq, record))
            db.execute("COMMIT")
    elapsed = time.perf_counter() - started
    page = db.execute("PRAGMA page_size").fetchone()[0]
    frames = (os.path.getsize(path + "-wal") - 32) / (page + 24)
    db.close()
    return frames / (threads * turns), elapsed / (threads * turns) * 1e6


if __name__ == "__main__":
    print("| layout | WAL frames per thread and turn | µs per thread and turn |")
    print("|---|---|---|")
    for name, schema in LAYOUTS.items():
        frames, micros = run(schema)
        print(f"| {name} | {frames:.1f} | {micros:.0f} |")
