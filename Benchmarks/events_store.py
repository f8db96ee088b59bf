#!/usr/bin/env python3
"""Issue 49: what kept events cost in the store (SQLite).

1. Bytes per event: a thread gets 1,000 settings changes and 20 turns (the
   scripted model); the stored events' record sizes per kind and the
   thread_events table's pages on disk (SQLite's dbstat) per event.
2. Trimming at 1 M stored events: 1,000 threads of 1,000 events each are
   written into the store (copies of the real rows of step 1), then the
   server runs its retention pass every 2 s while a client commits settings
   changes on another thread without pause: each pass's duration (the
   server's debug log) and the commits' latency around it, first with
   nothing to trim (keep_count 1,000), then trimming 900,000 (keep_count 100).

Usage: .build/venv/bin/python Benchmarks/events_store.py [SERVER_BIN]   (make bench-events)
"""
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict

from threadwire_client import Client
from threadwire_client import messages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".build/release/threadwire-server")


def start(data_dir, config=None, log=None):
    args = [BINARY, "--listen", "127.0.0.1:0", "--data-dir", data_dir, "--log-level", "debug" if log else "error"]
    if config is not None:
        path = os.path.join(data_dir, "..", "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        args += ["--config", path]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log or subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("threadwire listening on "), line
    return proc, int(line.rsplit(":", 1)[1])


def stop(proc):
    proc.terminate()
    proc.wait(timeout=30)


def connect(port):
    client = Client("127.0.0.1", port, timeout=30)
    client.initialize()
    return client


def run_turn(client, thread_id, text):
    turn = client.call("turn/start", {"thread_id": thread_id, "input": [{"text": text}]}).turn.id
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        turns = client.call("thread/read", {"thread_id": thread_id, "include_turns": True}).thread.turns
        if turns and turns[-1].id == turn and turns[-1].status not in (0, 1):  # neither UNSPECIFIED nor IN_PROGRESS
            return
        time.sleep(0.01)
    raise TimeoutError("turn did not end")


def bytes_per_event(work):
    data = os.path.join(work, "data")
    proc, port = start(data)
    client = connect(port)
    thread_id = client.call("thread/start", {}).thread.id
    for n in range(1000):
        client.call("thread/settings/update", {"thread_id": thread_id, "model": f"model-{n % 10}"})
    for n in range(20):
        run_turn(client, thread_id, f"turn {n}: " + "words " * 40)
    client.close()
    stop(proc)
    db = sqlite3.connect(os.path.join(data, "threadwire.sqlite"))
    sizes = defaultdict(list)
    for (record,) in db.execute("SELECT record FROM thread_events WHERE thread_id = ?", (thread_id,)):
        note = messages.envelope.Notification()
        note.ParseFromString(record)
        sizes[note.WhichOneof("payload")].append(len(record))
    count = sum(len(v) for v in sizes.values())
    print(f"## bytes per event: 1 thread, 1,000 settings changes and 20 turns, {count} kept events")
    print("| event | count | record bytes mean | min | max |")
    print("|---|---|---|---|---|")
    for kind, values in sorted(sizes.items(), key=lambda kv: -len(kv[1])):
        print(f"| {kind} | {len(values)} | {statistics.mean(values):.0f} | {min(values)} | {max(values)} |")
    total = sum(sum(v) for v in sizes.values())
    try:
        pages = db.execute("SELECT sum(pgsize) FROM dbstat WHERE name = 'thread_events'").fetchone()[0]
        print(f"\nall records: {total} bytes, {total / count:.0f} per event; thread_events on disk "
              f"(dbstat, table and key pages): {pages} bytes, {pages / count:.0f} per event")
    except sqlite3.OperationalError as error:
        print(f"\nall records: {total} bytes, {total / count:.0f} per event (dbstat not available: {error})")
    db.close()
    return data, thread_id


def fill(data, template_thread, threads=1000, per_thread=1000):
    """Copies of the template thread's row and of one settings event."""
    db = sqlite3.connect(os.path.join(data, "threadwire.sqlite"))
    columns = [row[1] for row in db.execute("PRAGMA table_info(threads)")]
    record = db.execute("SELECT record FROM thread_events WHERE thread_id = ? ORDER BY seq DESC LIMIT 1",
                        (template_thread,)).fetchone()[0]
    now = int(time.time() * 1000)
    picked = ", ".join("?" if c in ("id", "session_id", "event_sequence") else c for c in columns)
    started = time.monotonic()
    with db:
        for t in range(threads):
            new_id = f"0196b000-0000-7000-8000-{t:012d}"
            db.execute(f"INSERT INTO threads ({', '.join(columns)}) SELECT {picked} FROM threads WHERE id = ?",
                       [new_id if c in ("id", "session_id") else per_thread for c in columns
                        if c in ("id", "session_id", "event_sequence")] + [template_thread])
            db.executemany("INSERT INTO thread_events (thread_id, seq, created_at, record) VALUES (?, ?, ?, ?)",
                           ((new_id, seq, now - (per_thread - seq) * 10, record) for seq in range(1, per_thread + 1)))
    total = db.execute("SELECT count(*) FROM thread_events").fetchone()[0]
    db.close()
    print(f"\nwrote {threads} threads of {per_thread} events in {time.monotonic() - started:.1f} s: {total} stored events")
    return total


def trim_passes(work, data, keep_count, passes):
    log_path = os.path.join(work, f"log-{keep_count}.txt")
    with open(log_path, "w") as log:
        proc, port = start(data, {"events": {"keep_count": keep_count, "keep_age_ms": 86_400_000 * 30,
                                             "trim_interval_ms": 2000}}, log=log)
        client = connect(port)
        thread_id = client.call("thread/start", {}).thread.id
        latencies = []  # (end time, seconds)
        stop_at = time.monotonic() + 2.2 * passes + 1
        n = 0
        while time.monotonic() < stop_at:
            began = time.monotonic()
            client.call("thread/settings/update", {"thread_id": thread_id, "model": f"m-{n % 7}"})
            latencies.append(time.monotonic() - began)
            n += 1
        client.close()
        stop(proc)
    trims = []
    with open(log_path) as log:
        for line in log:
            if "trimmed old thread events" in line:
                fields = dict(re.findall(r"(tw\.[a-z_]+)=(\d+)", line))
                trims.append((int(fields.get("tw.events", 0)), int(fields.get("tw.duration_ms", 0))))
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1e3
    p99 = latencies[int(len(latencies) * 0.99)] * 1e3
    print(f"\nkeep_count {keep_count}: passes (events trimmed, ms): {trims}")
    print(f"  {len(latencies)} settings commits beside them: p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {latencies[-1] * 1e3:.1f} ms")


def main():
    work = tempfile.mkdtemp(prefix="tw-events-")
    data, thread_id = bytes_per_event(work)
    fill(data, thread_id)
    trim_passes(work, data, keep_count=1000, passes=3)
    trim_passes(work, data, keep_count=100, passes=2)
    db = sqlite3.connect(os.path.join(data, "threadwire.sqlite"))
    print(f"\nafter: {db.execute('SELECT count(*) FROM thread_events').fetchone()[0]} stored events")


if __name__ == "__main__":
    main()
