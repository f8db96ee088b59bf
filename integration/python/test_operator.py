"""Operators: a principal marked `operator` in the tokens file reads every
principal's threads (thread/list with all_principals, thread/read,
thread/turns/list), each with its principal named, and changes none of them;
everyone else keeps seeing only their own. On the real server."""
import signal
import time

import pytest

from conftest import tokens_file, start_listening, stop_server
from threadwire_client import Client
from threadwire_client.client import StatusError

ALICE = "alice-4c6e8a0b2d1f3e5a7c9b"
BOB = "bob-1a3c5e7b9d0f2e4a6c8e"
OPS = "ops-8d6b4f2a0c9e7a5c3e1b"
NOT_FOUND, PERMISSION_DENIED = 5, 7


@pytest.fixture()
def served(tmp_path):
    tokens = tokens_file(tmp_path, f"alice {ALICE}\nbob {BOB}\nops {OPS} operator\n")
    proc, addresses = start_listening(tmp_path, "--auth-tokens", str(tokens))
    host, port = addresses["frames"].rsplit(":", 1)
    yield proc, (host, int(port)), tokens
    stop_server(proc)


def connect(address, token, name):
    client = Client(*address)
    hello = client.initialize(name, auth_token=token)
    return client, hello


def status_of(call):
    with pytest.raises(StatusError) as failed:
        call()
    return failed.value.code


def test_an_operator_reads_every_principals_threads_and_changes_none(served):
    proc, address, tokens = served
    alice, hello = connect(address, ALICE, "alice")
    assert not hello.HasField("is_operator")
    mine = alice.call("thread/start", {"name": "alice's work"}).thread.id
    alice.call("turn/start", {"thread_id": mine, "input": [{"text": "hello"}]})
    bob, _ = connect(address, BOB, "bob")
    theirs = bob.call("thread/start", {"name": "bob's work"}).thread.id

    ops, hello = connect(address, OPS, "ops")
    assert hello.is_operator and hello.principal == "ops"
    listed = ops.call("thread/list", {"all_principals": True, "limit": 100})
    owners = {thread.id: thread.principal for thread in listed.data}
    assert owners == {mine: "alice", theirs: "bob"}
    # Its own list, without the flag, is its own (none).
    assert list(ops.call("thread/list", {}).data) == []

    read = ops.call("thread/read", {"thread_id": mine, "include_turns": True})
    assert read.thread.principal == "alice" and read.thread.name == "alice's work"
    assert read.thread.turns, "the operator reads the turns too"
    assert ops.call("thread/turns/list", {"thread_id": mine}).data
    assert ops.call("thread/read", {"thread_id": theirs}).thread.principal == "bob"
    # Not a change of any kind: the same NOT_FOUND a missing thread gets.
    assert status_of(lambda: ops.call("thread/settings/update", {"thread_id": mine, "model": "other"})) == NOT_FOUND
    assert status_of(lambda: ops.call("thread/resume", {"thread_id": mine})) == NOT_FOUND
    assert status_of(lambda: ops.call("turn/start", {"thread_id": mine, "input": [{"text": "x"}]})) == NOT_FOUND
    assert status_of(lambda: ops.call("thread/archive", {"thread_id": theirs})) == NOT_FOUND

    # Everyone else: their own threads, no principal named, no flag.
    assert status_of(lambda: bob.call("thread/list", {"all_principals": True})) == PERMISSION_DENIED
    assert status_of(lambda: bob.call("thread/read", {"thread_id": mine})) == NOT_FOUND
    own = alice.call("thread/read", {"thread_id": mine}).thread
    assert not own.HasField("principal")

    # The mark is read from the tokens file as it is now: a reload drops it.
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\nops {OPS}\n")
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while True:
        try:
            ops.call("thread/list", {"all_principals": True})
        except StatusError as refused:
            assert refused.code == PERMISSION_DENIED
            break
        assert time.monotonic() < deadline, "still an operator 10 s after the reload"
        time.sleep(0.05)
    assert status_of(lambda: ops.call("thread/read", {"thread_id": mine})) == NOT_FOUND
    for client in (alice, bob, ops):
        client.close()
