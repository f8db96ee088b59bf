"""Upgrade: a store written by an earlier release (integration/upgrade/fixtures/,
made by integration/upgrade/make_fixture.py with that release's binary) opens
with this build, migrates, and serves every thread exactly as that release
did; then it takes new writes, which survive a restart. On SQLite and on
PostgreSQL (a dump restored into a throwaway cluster)."""
import json
import shutil
import sys
from pathlib import Path

import pytest

UPGRADE = Path(__file__).resolve().parents[1] / "upgrade"
sys.path.insert(0, str(UPGRADE))
import upgrade_support as support  # noqa: E402
from threadwire_client.client import notification_thread_id  # noqa: E402

FIXTURES = sorted(path for path in (UPGRADE / "fixtures").iterdir() if path.is_dir())


def test_there_is_a_fixture():
    assert FIXTURES, "integration/upgrade/fixtures holds no release's store"


# Fields this build reports that the fixtures' releases did not know, by
# where they sit in a thread/read result: a stored thread reads as the release
# served it plus these, nothing else. can_accept_direct_input is sent for V2
# children only (false).
ADDED_SINCE_THE_FIXTURES = [("thread", "can_accept_direct_input")]


def without_added_fields(read):
    read = json.loads(json.dumps(read))
    for parent, field in ADDED_SINCE_THE_FIXTURES:
        read.get(parent, {}).pop(field, None)
    return read


def kept_numbers(client, thread, head):
    """The numbers of `thread`'s kept events replayed from the start, up to `head`."""
    client.call("thread/subscribe", {"thread_id": thread, "after_thread_sequence": 0})
    numbers = []
    for note in client.iter_notifications():
        if note.HasField("thread_sequence") and notification_thread_id(note) == thread:
            numbers.append(note.thread_sequence)
            if note.thread_sequence >= head:
                return numbers


def serves_unchanged_then_writes(store_arguments, work, expected):
    threads = sorted(expected["threads"])
    with support.Server(store_arguments, work) as server, server.client() as client:
        now = support.snapshot(client, threads)
        for thread in threads:
            assert without_added_fields(now["threads"][thread]) == expected["threads"][thread], f"thread {thread} reads differently"
        assert now["lists"] == expected["lists"]
        # The events a release kept (issue 49) are all still there, in order.
        for thread in threads:
            head = int(now["threads"][thread]["thread"].get("thread_sequence", 0))
            if head:
                assert kept_numbers(client, thread, head) == list(range(1, head + 1)), f"thread {thread}'s kept events"
        # It takes writes: a settings change and a turn on an old thread.
        target = expected["lists"]["active"][0]
        client.call("thread/settings/update", {"thread_id": target, "model": "after-upgrade"})
        turn = client.call("turn/start", {"thread_id": target, "input": [{"text": "after the upgrade"}]}).turn.id
    with support.Server(store_arguments, work) as server, server.client() as client:
        read = client.call("thread/read", {"thread_id": target, "include_turns": True, "turns_limit": 1000}).thread
        assert read.model == "after-upgrade"
        assert turn in [t.id for t in read.turns]
        assert len(read.turns) == len(expected["threads"][target]["thread"].get("turns", [])) + 1


@pytest.mark.parametrize("fixture", FIXTURES, ids=[path.name for path in FIXTURES])
def test_sqlite_store_of_an_earlier_release(fixture, tmp_path):
    expected = json.loads((fixture / "expected.json").read_text())["sqlite"]
    shutil.copytree(fixture / "sqlite", tmp_path / "store")
    serves_unchanged_then_writes(["--data-dir", str(tmp_path / "store")], tmp_path, expected)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[path.name for path in FIXTURES])
def test_postgres_store_of_an_earlier_release(fixture, tmp_path):
    expected = json.loads((fixture / "expected.json").read_text())["postgres"]
    with support.Postgres() as postgres:
        url = postgres.restore("upgraded", (fixture / "postgres.sql").read_text())
        serves_unchanged_then_writes(["--store", url], tmp_path, expected)
