#!/usr/bin/env python3
"""What a savepoint per commit costs SQLite's group commit, modelled without the server.

Each round is one group commit of 16 threads' settings changes, as the
server's commit queue groups 16 connections' thread/settings/update: per
thread, the versioned UPDATE of its row (the server's 26 columns and
indexes) and, with events kept, the INSERT of a 63-byte event. Written with
each commit in its own savepoint (SAVEPOINT / RELEASE around it, as every
group was before) and without (as a group is now unless one commit fails).
Prints the process CPU per commit (this Python's own statement overhead is
in every row alike) and the WAL bytes per group commit. synchronous=FULL,
temp_store=MEMORY, WAL, as the server's writer.

Usage: python3 Benchmarks/commit_savepoints.py [rounds]
"""
import os
import sqlite3
import sys
import tempfile
import time
import uuid

COLUMNS = ["session_id", "parent_id", "forked_from_id", "source", "depth", "task_name", "nickname", "preview", "name",
           "created_at", "updated_at", "archived", "runtime", "legacy", "selected_mode", "model", "cwd",
           "base_instructions", "config_overrides", "version", "agent_status", "agent_final_message", "agent_closed",
           "tool_settings", "agent_role", "event_sequence"]
SCHEMA = """
CREATE TABLE threads (id TEXT PRIMARY KEY NOT NULL, owner TEXT, session_id TEXT NOT NULL, parent_id TEXT,
  forked_from_id TEXT, source TEXT NOT NULL, depth INTEGER NOT NULL, task_name TEXT, nickname TEXT, preview TEXT NOT NULL,
  name TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, archived INTEGER NOT NULL, runtime TEXT,
  legacy INTEGER NOT NULL, selected_mode TEXT, model TEXT NOT NULL, cwd TEXT NOT NULL, base_instructions TEXT,
  config_overrides TEXT NOT NULL, version INTEGER, agent_status TEXT, agent_final_message TEXT, agent_closed INTEGER,
  tool_settings TEXT, agent_role TEXT, event_sequence INTEGER NOT NULL DEFAULT 0);
CREATE INDEX threads_created ON threads(archived, created_at, id);
CREATE INDEX threads_updated ON threads(archived, updated_at, id);
CREATE INDEX threads_parent ON threads(parent_id);
CREATE INDEX threads_owner_created ON threads(owner, archived, created_at, id);
CREATE INDEX threads_owner_updated ON threads(owner, archived, updated_at, id);
CREATE TABLE thread_events (thread_id TEXT NOT NULL, seq INTEGER NOT NULL, created_at INTEGER NOT NULL, record BLOB NOT NULL);
CREATE UNIQUE INDEX thread_events_by_thread ON thread_events (thread_id, seq);
"""
UPDATE = ("UPDATE threads SET " + ", ".join(f"{c} = ?" for c in COLUMNS) +
          " WHERE id = ? AND version = ? AND owner = ?")
INSERT_EVENT = "INSERT INTO thread_events (thread_id, seq, created_at, record) VALUES (?, ?, ?, ?)"


def run(savepoints, events, threads=16, rounds=1500, event_bytes=63):
    path = os.path.join(tempfile.mkdtemp(prefix="tw-savepoints-"), "store.sqlite")
    db = sqlite3.connect(path, isolation_level=None)
    # No automatic checkpoint: the WAL is measured, then emptied, every 100 rounds.
    for pragma in ("journal_mode=WAL", "synchronous=FULL", "temp_store=MEMORY", "wal_autocheckpoint=0"):
        db.execute(f"PRAGMA {pragma}")
    db.executescript(SCHEMA)
    ids = [str(uuid.uuid4()) for _ in range(threads)]
    now = 1_700_000_000_000
    for thread in ids:
        db.execute("INSERT INTO threads (id, owner, session_id, source, depth, preview, created_at, updated_at, archived, "
                   "legacy, model, cwd, config_overrides, version, tool_settings) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                   (thread, "alice", thread, "appServer", 0, "a preview", now, now, 0, 0, "gpt-5", "/work", "{}", 1, "{}"))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    version = {thread: 1 for thread in ids}
    record = os.urandom(event_bytes)
    wal_bytes = 0
    started = time.process_time()
    for round_ in range(rounds):
        db.execute("BEGIN")
        for thread in ids:
            if savepoints:
                db.execute("SAVEPOINT commit_")
            v = version[thread]
            values = [thread, None, None, "appServer", 0, None, None, "a preview", None, now, now + v, 0, "v2", 0,
                      "proactive", "gpt-5", "/work", None, "{}", v + 1, None, None, 0, "{}", None, v]
            db.execute(UPDATE, values + [thread, v, "alice"])
            if events:
                db.execute(INSERT_EVENT, (thread, v, now, record))
            version[thread] = v + 1
            if savepoints:
                db.execute("RELEASE commit_")
        db.execute("COMMIT")
        if round_ % 100 == 99:
            wal_bytes += os.path.getsize(path + "-wal")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    cpu = time.process_time() - started
    wal_bytes += os.path.getsize(path + "-wal")
    db.close()
    return cpu / (threads * rounds) * 1e6, wal_bytes / rounds


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    print("| commit | savepoint per commit | CPU µs per commit | WAL bytes per group commit |")
    print("|---|---|---|---|")
    for events in (False, True):
        for savepoints in (True, False):
            cpu, wal = run(savepoints, events, rounds=rounds)
            what = "update + event" if events else "update"
            print(f"| {what} | {'yes' if savepoints else 'no'} | {cpu:.1f} | {wal:,.0f} |", flush=True)
