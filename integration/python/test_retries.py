"""The Python client's retries (ReconnectingClient) against the real server:
a change sent again after its answer was lost is applied once."""
import os
import socket
import subprocess
import threading
import time

import pytest

from conftest import ROOT
from threadwire_client import MUTATING_METHODS, Client, ReconnectingClient, RetryPolicy, StatusError, messages

BINARY = os.environ.get("THREADWIRE_SERVER_BIN", str(ROOT / ".build" / "debug" / "threadwire-server"))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(data_dir, port, environment=None):
    env = dict(os.environ)
    env.update(environment or {})
    proc = subprocess.Popen([BINARY, "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir), "--log-level", "error"],
                            stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline().strip()
    assert line.startswith("threadwire listening on "), line
    return proc


def connect(port):
    client = Client("127.0.0.1", port, timeout=10)
    client.initialize()
    return client


def turn_start(thread_id, text):
    return {"thread_id": thread_id, "input": [{"text": text}]}


def test_a_change_whose_answer_was_lost_is_applied_once(tmp_path):
    port = free_port()
    server = start_server(tmp_path, port)
    setup = connect(port)
    thread_id = setup.call("thread/start", {}).thread.id
    setup.close()
    server.terminate()
    server.wait(10)
    # The next keyed change kills the server after its commit, before its answer.
    server = start_server(tmp_path, port, {"THREADWIRE_FAULT_POINTS": "idempotency.after-change"})
    restarted = {}

    def restart_when_dead():
        server.wait(30)
        restarted["proc"] = start_server(tmp_path, port)

    watcher = threading.Thread(target=restart_when_dead)
    watcher.start()
    attempts = []
    retrying = ReconnectingClient(lambda: connect(port), RetryPolicy(max_attempts=40, initial_backoff=0.05, max_backoff=0.3))
    try:
        response = retrying.response("turn/start", turn_start(thread_id, "once"), on_attempt=lambda n, key: attempts.append(key))
        watcher.join(30)
        assert response.code == 0, response.message
        assert len(attempts) >= 2, "the change was never sent again"
        assert len(set(attempts)) == 1 and attempts[0], "every attempt must carry the same key"
        turns = connect(port).call("thread/read", {"thread_id": thread_id, "include_turns": True}).thread.turns
        assert [turn.id for turn in turns] == [response.turn_start.turn.id], "the retry applied the change twice"
    finally:
        retrying.close()
        watcher.join(30)
        for proc in (server, restarted.get("proc")):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(10)


def test_keys_and_what_needs_them(server):
    host, port = server
    client = Client(host, port)
    client.initialize()
    thread_id = client.call("thread/start", {}).thread.id
    first = client.call("turn/start", turn_start(thread_id, "a"), idempotency_key="py-1")
    again = client.call("turn/start", turn_start(thread_id, "a"), idempotency_key="py-1")
    assert again.turn.id == first.turn.id
    with pytest.raises(StatusError) as refused:
        client.call("turn/start", turn_start(thread_id, "b"), idempotency_key="py-1")
    assert refused.value.code == 3 and "other params" in refused.value.message
    # The client's fallback table agrees with what the server reflects.
    reflected = {name: spec.mutates for name, spec in client.schema().methods.items()}
    assert {name for name, mutates in reflected.items() if mutates} == MUTATING_METHODS
    retrying = ReconnectingClient(lambda: connect(port))
    assert retrying.mutates("thread/settings/update") and not retrying.mutates("thread/read")
    retrying.close()
    client.close()


def test_unavailable_is_retried_then_returned(tmp_path):
    """A server that answers UNAVAILABLE (draining) is asked again, up to the
    policy's attempts; the last answer is returned."""
    port = free_port()
    server = start_server(tmp_path, port)
    try:
        client = connect(port)
        calls = []
        retrying = ReconnectingClient(lambda: client, RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02))
        # A draining server refuses new work with UNAVAILABLE: SIGTERM with a long turn grace keeps it draining.
        thread_id = client.call("thread/start", {}).thread.id
        client.call("turn/start", turn_start(thread_id, "#hold"))
        server.terminate()
        # SIGTERM is handled asynchronously: wait until the server says it drains.
        deadline = time.monotonic() + 10
        while client.call("health/check").status != messages.health.SERVING_STATUS_NOT_SERVING:
            assert time.monotonic() < deadline, "the server never began draining after SIGTERM"
            time.sleep(0.02)
        response = retrying.response("thread/settings/update", {"thread_id": thread_id, "model": "m"},
                                     on_attempt=lambda n, key: calls.append(n))
        assert response.code == 14, response
        assert calls == [1, 2, 3]
    finally:
        server.kill()
        server.wait(10)
