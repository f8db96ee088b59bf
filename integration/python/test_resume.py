"""Issue 49 from Python: a ResumingSubscription outlives kill -9 of the
server and hands on every kept event of the thread once, in order."""
import socket
import subprocess
import threading
import time

from test_retries import BINARY, connect, free_port, start_server
from threadwire_client import ResumingSubscription, RetryPolicy, notification_thread_id


def test_a_subscription_outlives_kill_9_and_misses_nothing(tmp_path):
    port = free_port()
    server = start_server(tmp_path / "store", port)
    try:
        writer = connect(port)
        thread_id = writer.call("thread/start", {}).thread.id
        subscription = ResumingSubscription([thread_id], lambda: connect(port), after={thread_id: 1},
                                            policy=RetryPolicy(max_attempts=1 << 30, initial_backoff=0.02, max_backoff=0.2))
        heard = []

        def listen():
            for notification in subscription:
                if notification.HasField("thread_sequence"):
                    heard.append((notification.thread_sequence, notification.WhichOneof("payload")))

        threading.Thread(target=listen, daemon=True).start()
        for n in range(15):
            writer.call("thread/settings/update", {"thread_id": thread_id, "model": f"before-{n}"})
        server.kill()
        server.wait(timeout=10)
        server = start_server(tmp_path / "store", port)
        writer = connect(port)
        # Made at once, before the subscription has connected again.
        for n in range(15):
            writer.call("thread/settings/update", {"thread_id": thread_id, "model": f"after-{n}"})
        head = writer.call("thread/read", {"thread_id": thread_id}).thread.thread_sequence
        assert head == 31
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not heard or heard[-1][0] != head):
            time.sleep(0.02)
        assert [number for number, _ in heard] == list(range(2, head + 1)), heard
        assert {payload for _, payload in heard} == {"thread_settings_updated"}
        assert subscription.connections >= 2
    finally:
        server.kill()
        server.wait(timeout=10)


def test_a_child_spawned_while_the_connection_was_down_is_heard_from_its_first_event(tmp_path):
    port = free_port()
    config = tmp_path / "config.json"
    config.write_text('{"features": {"multi_agent": true}}')
    server = subprocess.Popen([BINARY, "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "store"),
                               "--config", str(config), "--log-level", "error"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().startswith("threadwire listening on ")
        writer = connect(port)
        root = writer.call("thread/start", {}).thread.id
        turn = writer.call("turn/start", {"thread_id": root, "input": [{"text": "resolve the runtime"}]}).turn.id
        deadline = time.monotonic() + 10
        while writer.call("thread/read", {"thread_id": root, "include_turns": True}).thread.turns[-1].status == 1:
            assert time.monotonic() < deadline, f"turn {turn} still running"
            time.sleep(0.02)
        head = writer.call("thread/read", {"thread_id": root}).thread.thread_sequence
        # Connections are refused while `away` is set: what happens meanwhile happens while the subscription is away.
        away = threading.Event()

        def dial():
            if away.is_set():
                raise ConnectionError("away")
            return connect(port)

        subscription = ResumingSubscription([root], dial, after={root: head},
                                            policy=RetryPolicy(max_attempts=1 << 30, initial_backoff=0.02, max_backoff=0.1))
        heard = {}

        def listen():
            for notification in subscription:
                if notification.HasField("thread_sequence"):
                    thread_id = notification_thread_id(notification)
                    heard.setdefault(thread_id, []).append((notification.thread_sequence, notification.WhichOneof("payload")))

        threading.Thread(target=listen, daemon=True).start()
        deadline = time.monotonic() + 10
        while subscription.connections < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        away.set()
        _close_socket_of(subscription)
        child = writer.call("agent/spawn", {"parent_thread_id": root}).thread.id
        for n in range(3):
            writer.call("thread/settings/update", {"thread_id": child, "model": f"away-{n}"})
        away.clear()
        child_head = writer.call("thread/read", {"thread_id": child}).thread.thread_sequence
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and [n for n, _ in heard.get(child, [])][-1:] != [child_head]:
            time.sleep(0.02)
        assert [n for n, _ in heard.get(child, [])] == list(range(1, child_head + 1)), heard
        assert heard[child][0][1] == "thread_started"
        assert subscription.connections >= 2
    finally:
        server.kill()
        server.wait(timeout=10)


def _close_socket_of(subscription):
    """Cuts the subscription's current connection, as a network would."""
    client = subscription.client
    if client is not None:
        client.sock.shutdown(socket.SHUT_RDWR)
