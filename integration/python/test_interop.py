"""Google's protobuf runtime (independent of protobuf-c) talks to the real
threadwire server: both implementations must agree on every byte."""
import struct
import time

import pytest
from threadwire_client import Client, StatusError, messages

MA = messages.multi_agent
TURN = messages.turn


def test_health_check_before_initialize(server):
    with Client(*server) as client:
        result = client.call("health/check")
        assert result.status == messages.health.SERVING_STATUS_SERVING


def test_initialize_validates_and_reports_limits(server):
    with Client(*server) as client:
        with pytest.raises(StatusError) as error:
            client.call("initialize", {"protocol_version": 1})
        assert error.value.code == 3 and "client_info.name" in error.value.message
        with pytest.raises(StatusError) as error:
            client.call("thread/start")
        assert error.value.code == 9
        info = client.initialize("python-interop")
        assert info.server_info.name == "threadwire"
        assert info.limits.max_frame_bytes == 4 * 1024 * 1024
        assert info.limits.max_queued_request_bytes == 8 * 1024 * 1024
        assert info.limits.max_notification_backlog_bytes == 8 * 1024 * 1024
        assert info.limits.HasField("idle_timeout_ms")


def test_thread_turn_and_settings_round_trip(server):
    with Client(*server) as client:
        client.initialize()
        started = client.call("thread/start", {"multi_agent_mode": "MULTI_AGENT_MODE_PROACTIVE", "name": "interop ✓ héllo"})
        thread_id = started.thread.id
        assert started.thread.name == "interop ✓ héllo"
        assert started.HasField("multi_agent_mode") and started.multi_agent_mode == MA.MULTI_AGENT_MODE_PROACTIVE
        assert started.multi_agent_runtime == MA.MULTI_AGENT_RUNTIME_UNSPECIFIED

        turn = client.call("turn/start", {"thread_id": thread_id, "input": [{"text": "hello from python"}]}).turn
        names = []
        for notification in client.iter_notifications():
            names.append(notification.WhichOneof("payload"))
            if names[-1] == "turn_completed" and notification.turn_completed.turn.id == turn.id:
                break
        assert names[0] == "thread_started" and "turn_started" in names and "item_completed" in names

        read = client.call("thread/read", {"thread_id": thread_id, "include_turns": True, "include_model_requests": True})
        thread = read.thread
        assert thread.multi_agent_runtime == MA.MULTI_AGENT_RUNTIME_V2
        last = thread.turns[-1]
        assert last.context.effective_multi_agent_mode == MA.MULTI_AGENT_MODE_PROACTIVE
        assert TURN.CONTEXT_KIND_MULTI_AGENT_MODE in [item.kind for item in last.model_requests[-1].context]
        assert [i.text for i in last.items] == ["hello from python", "echo: hello from python"]

        # thread/turns/list pages the same turns, newest first by default.
        page = client.call("thread/turns/list", {"thread_id": thread_id, "limit": 1})
        assert [t.id for t in page.data] == [turn.id] and not page.HasField("next_cursor")
        assert not read.HasField("turns_next_cursor")

        # Clearing is explicit presence: the oneof's bool member; the result omits the field.
        cleared = client.call("thread/settings/update", {"thread_id": thread_id, "clear_multi_agent_mode": True})
        assert cleared.changed and not cleared.settings.HasField("multi_agent_mode")


def test_pipelined_calls_each_get_their_response(server):
    with Client(*server) as client:
        client.initialize()
        responses = client.call_many([("thread/start", {"name": f"t{i}"}) for i in range(50)])
        assert [r.thread_start.thread.name for r in responses] == [f"t{i}" for i in range(50)]
        sequences = [n.sequence for n in client.notifications]
        assert sequences == list(range(1, len(sequences) + 1))


def test_errors_keep_the_connection(server):
    with Client(*server) as client:
        client.initialize()
        client.send_frame(b"\x0a\xff\xff\x01")  # not an Envelope
        with pytest.raises(StatusError) as error:
            client.call("thread/settings/update", {"thread_id": "nope", "multi_agent_mode": "MULTI_AGENT_MODE_PROACTIVE"})
        assert error.value.code == 5
        assert client.unmatched and client.unmatched[0].code == 3 and not client.unmatched[0].HasField("id")
        assert client.call("health/check").status == messages.health.SERVING_STATUS_SERVING


def test_bad_flags_close_with_an_error_frame(server):
    with Client(*server) as client:
        client.initialize()
        client.sock.sendall(b"\x01\x00\x00\x00\x00")
        with pytest.raises(ConnectionError):
            client.call("health/check")
        assert client.unmatched[0].code == 3 and "flags" in client.unmatched[0].message
    with Client(*server) as other:
        assert other.call("health/check").status == messages.health.SERVING_STATUS_SERVING
