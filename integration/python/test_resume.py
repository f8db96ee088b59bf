"""Issue 49 from Python: a ResumingSubscription outlives kill -9 of the
server and hands on every kept event of the thread once, in order."""
import threading
import time

from test_retries import connect, free_port, start_server
from threadwire_client import ResumingSubscription, RetryPolicy


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
