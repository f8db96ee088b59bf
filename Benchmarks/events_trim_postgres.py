#!/usr/bin/env python3
"""Issue 49: PostgreSQL's retention pass at 1 M stored events, the one
statement it was against the statements it is now.

1,000 threads of 1,000 events each (copies of a real thread row and of a
real settings event, made by the server) in a throwaway PostgreSQL. Then,
with psql's \\timing, on the same data:
  - before: the single `DELETE … USING threads` over every stored event
    (rolled back, so the next measurement finds the same rows), with nothing
    to trim (keep 1,000) and trimming 900,000 (keep 100);
  - after: the search for threads with something to forget (an index probe
    each for its oldest event), then one statement per 16 threads: the
    search's time, each statement's, their sum and the longest.
The longest single statement is what a pass can hold for, and what has to
fit in the store's operation timeout (5 s by default).

Usage: .build/venv/bin/python Benchmarks/events_trim_postgres.py [SERVER_BIN]   (make bench-events-postgres)
"""
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "integration", "upgrade"))
from upgrade_support import Postgres  # noqa: E402
from threadwire_client import Client  # noqa: E402

BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".build/release/threadwire-server")
THREADS, PER_THREAD, PER_STATEMENT = 1000, 1000, 16


def template_thread(url, work):
    proc = subprocess.Popen([BINARY, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(work, "data"), "--store", url,
                             "--log-level", "error"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("threadwire listening on "), line
    client = Client("127.0.0.1", int(line.rsplit(":", 1)[1]), timeout=30)
    client.initialize()
    thread_id = client.call("thread/start", {}).thread.id
    for n in range(10):
        client.call("thread/settings/update", {"thread_id": thread_id, "model": f"model-{n}"})
    client.close()
    proc.terminate()
    proc.wait(timeout=30)
    return thread_id


def timed(pg, database, script):
    """Each statement's time in ms, from psql's \\timing."""
    out = pg.psql(database, stdin="\\timing on\n" + script)
    return [float(ms) for ms in re.findall(r"Time: ([\d.]+) ms", out)]


def old_delete(keep, before):
    return f"""DELETE FROM thread_events e USING threads t
        WHERE t.id = e.thread_id AND e.seq < t.event_sequence
          AND (e.seq <= t.event_sequence - {keep} OR e.created_at < {before});"""


def search(keep, before):
    return f"""SELECT t.id FROM threads t
        CROSS JOIN LATERAL (SELECT e.seq, e.created_at FROM thread_events e
                            WHERE e.thread_id = t.id ORDER BY e.seq LIMIT 1) oldest
        WHERE oldest.seq < t.event_sequence
          AND (oldest.seq <= t.event_sequence - {keep} OR oldest.created_at < {before})"""


def batch_delete(ids, keep, before):
    listed = ",".join(f"'{i}'" for i in ids)
    return f"""DELETE FROM thread_events e USING threads t
        WHERE t.id = ANY(ARRAY[{listed}]) AND t.id = e.thread_id AND e.seq < t.event_sequence
          AND (e.seq <= t.event_sequence - {keep} OR e.created_at < {before});"""


def main():
    work = tempfile.mkdtemp(prefix="tw-trim-pg-")
    with Postgres() as pg:
        database = "tw_trim"
        url = pg.create(database)
        template = template_thread(url, work)
        started = time.monotonic()
        pg.psql(database, stdin=f"""
            CREATE TEMP TABLE copies AS SELECT t.*, g AS copy_no FROM threads t, generate_series(1, {THREADS}) g WHERE t.id = '{template}';
            UPDATE copies SET id = '0196b000-0000-7000-8000-' || lpad(copy_no::text, 12, '0'), event_sequence = {PER_THREAD};
            UPDATE copies SET session_id = id;
            ALTER TABLE copies DROP COLUMN copy_no;
            INSERT INTO threads SELECT * FROM copies;
            INSERT INTO thread_events (thread_id, seq, created_at, record)
              SELECT c.id, s, (extract(epoch FROM now()) * 1000)::BIGINT - ({PER_THREAD} - s) * 10,
                     (SELECT record FROM thread_events WHERE thread_id = '{template}' ORDER BY seq DESC LIMIT 1)
              FROM copies c, generate_series(1, {PER_THREAD}) s;
            VACUUM ANALYZE thread_events; ANALYZE threads;
            """)
        stored = int(pg.psql(database, "-At", "-c", "SELECT count(*) FROM thread_events").strip())
        print(f"wrote {THREADS} threads of {PER_THREAD} events in {time.monotonic() - started:.1f} s: {stored} stored events")
        month_ago = 0  # the age limit never applies here: count alone decides
        print("\n| pass | keep | events forgotten | statements | search ms | longest statement ms | all statements ms |")
        print("|---|---|---|---|---|---|---|")
        for keep in (1000, 100):
            times = timed(pg, database, f"BEGIN;\n{old_delete(keep, month_ago)}\nROLLBACK;\n")
            gone = THREADS * max(0, PER_THREAD - keep)
            print(f"| before (one DELETE, rolled back) | {keep} | {gone} | 1 | — | {times[1]:.0f} | {times[1]:.0f} |")
        for keep in (1000, 100):
            search_ms = timed(pg, database, search(keep, month_ago) + ";\n")[0]
            due = [line for line in pg.psql(database, "-At", "-c", search(keep, month_ago)).split("\n") if line]
            statements = [due[i:i + PER_STATEMENT] for i in range(0, len(due), PER_STATEMENT)]
            times = timed(pg, database, "".join(batch_delete(ids, keep, month_ago) + "\n" for ids in statements)) if statements else []
            left = int(pg.psql(database, "-At", "-c", "SELECT count(*) FROM thread_events").strip())
            longest = f"{max(times):.0f}" if times else "—"
            print(f"| after (search, then {PER_STATEMENT} threads a statement) | {keep} | {stored - left} | {len(times)} | "
                  f"{search_ms:.0f} | {longest} | {sum(times):.0f} |")
            stored = left


if __name__ == "__main__":
    main()
