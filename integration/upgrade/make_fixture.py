"""Writes an upgrade fixture: a store populated by one release's server, and
what that server answered for every thread afterwards (issue 46, item 4).

    make_fixture.py --server-bin PATH --release NAME --out integration/upgrade/fixtures
                    [--postgres-bin DIR]

Makes integration/upgrade/fixtures/NAME/ with
- sqlite/            the SQLite store's files after a graceful stop;
- postgres.sql       a plain pg_dump of the same session on PostgreSQL;
- expected.json      per store kind, each thread's thread/read (turns
                     included) and the thread lists, read cold after a restart.

The session covers what later releases must keep reading: both multi-agent
modes, a settings update, a name, a fork, a spawned child, an archived
thread, and imported codex rollouts (a v2 parent with its child and a legacy
root) that were never resumed, so a later release still pins them.
Run it with a release's binary (`git worktree` of the release, `swift
build`); integration/python/test_upgrade.py opens every fixture with the binary
under test.
"""
import argparse
import base64
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import upgrade_support as support  # noqa: E402

ROLLOUTS = HERE.parent / "rollouts"


def wait_idle(client, thread_id):
    deadline = time.monotonic() + 30
    while client.call("thread/read", {"thread_id": thread_id}).thread.status.type == 3:  # ACTIVE
        assert time.monotonic() < deadline, f"thread {thread_id} stayed active"
        time.sleep(0.02)


def session(client):
    """The writes; returns the ids of every thread made."""
    run = lambda thread, text: (client.call("turn/start", {"thread_id": thread, "input": [{"text": text}]}),  # noqa: E731
                                wait_idle(client, thread))
    proactive = client.call("thread/start", {"name": "proactive", "multi_agent_mode": "MULTI_AGENT_MODE_PROACTIVE",
                                             "config": [{"key": "features.multi_agent_v2", "value": "true"}]}).thread.id
    run(proactive, "hello from the release")
    client.call("thread/settings/update", {"thread_id": proactive, "model": "model-2", "cwd": "/work/two",
                                           "multi_agent_mode": "MULTI_AGENT_MODE_EXPLICIT_REQUEST_ONLY"})
    run(proactive, "after the settings update")
    child = client.call("agent/spawn", {"parent_thread_id": proactive, "message": "explore", "task_name": "explorer"}).thread.id
    wait_idle(client, child)
    fork = client.call("thread/fork", {"thread_id": proactive}).thread.id
    run(fork, "in the fork")
    client.call("thread/name/set", {"thread_id": fork, "name": "the fork"})
    explicit = client.call("thread/start", {"multi_agent_mode": "MULTI_AGENT_MODE_EXPLICIT_REQUEST_ONLY"}).thread.id
    run(explicit, "to be archived")
    client.call("thread/archive", {"thread_id": explicit})
    imported = []
    for name in ("parent_v2.jsonl", "child_explorer.jsonl", "root.jsonl"):
        lines = [base64.b64encode(line).decode() for line in (ROLLOUTS / name).read_bytes().splitlines()]
        imported.append(client.call("thread/import", {"file_name": name, "lines": lines}).report.thread_id)
    listed = client.call("thread/list", {"limit": 100}).data
    archived = client.call("thread/list", {"limit": 100, "archived": True}).data
    return sorted({t.id for t in listed} | {t.id for t in archived} | {proactive, child, fork, explicit} | set(imported))


def populate(store_arguments, data_dir, out_store_dir=None):
    """Runs the session on a server with `store_arguments`, restarts it, reads
    everything cold; returns the reads."""
    with support.Server(store_arguments, data_dir) as server:
        with server.client() as client:
            threads = session(client)
    with support.Server(store_arguments, data_dir) as server:
        with server.client() as client:
            return support.snapshot(client, threads)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server-bin", required=True)
    parser.add_argument("--release", required=True)
    parser.add_argument("--out", default=str(HERE / "fixtures"))
    args = parser.parse_args()
    os.environ["THREADWIRE_SERVER_BIN"] = os.path.abspath(args.server_bin)
    target = Path(args.out, args.release)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="threadwire-fixture-"))
    try:
        expected = {"release": args.release}
        expected["sqlite"] = populate(["--data-dir", str(work / "store")], work)
        shutil.copytree(work / "store", target / "sqlite")
        # One file: the write-ahead log folded in (the content is the same).
        connection = sqlite3.connect(target / "sqlite" / "threadwire.sqlite")
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.execute("PRAGMA journal_mode=DELETE")
        connection.close()
        with support.Postgres() as postgres:
            url = postgres.create("fixture")
            expected["postgres"] = populate(["--store", url], work)
            (target / "postgres.sql").write_text(postgres.dump("fixture"))
        (target / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
