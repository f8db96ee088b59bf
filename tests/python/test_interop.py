"""Google's protobuf runtime (an implementation independent of protobuf-c) talks
to the real threadwire server: both must agree on every byte."""
import struct
import time

from threadwire_client import Client


def initialized(pb, server):
    client = Client(pb, *server)
    response = client.call("initialize", protocol_version=1)
    assert response.code == 3 and "client_info.name" in response.message
    envelope = pb.Envelope()
    envelope.request.id = 99
    envelope.request.initialize.client_info.name = "python-interop"
    envelope.request.initialize.protocol_version = 1
    reply = client.send_request(envelope)
    assert reply.code == 0, reply.message
    assert reply.initialize.server_info.name == "threadwire"
    assert reply.initialize.limits.max_frame_bytes == 4 * 1024 * 1024
    return client


def test_health_check_before_initialize(pb, server):
    client = Client(pb, *server)
    response = client.call("health_check")
    assert response.code == 0
    assert response.WhichOneof("result") == "health_check"
    assert response.health_check.status == pb.health.SERVING_STATUS_SERVING


def test_thread_start_turn_and_settings_round_trip(pb, server):
    client = initialized(pb, server)
    envelope = pb.Envelope()
    envelope.request.id = 1000
    envelope.request.thread_start.multi_agent_mode = pb.ma.MULTI_AGENT_MODE_PROACTIVE
    envelope.request.thread_start.name = "interop ✓ héllo"
    started = client.send_request(envelope)
    assert started.code == 0, started.message
    result = started.thread_start
    thread_id = result.thread.id
    assert result.thread.name == "interop ✓ héllo"
    assert result.HasField("multi_agent_mode") and result.multi_agent_mode == pb.ma.MULTI_AGENT_MODE_PROACTIVE
    assert result.multi_agent_runtime == pb.ma.MULTI_AGENT_RUNTIME_UNSPECIFIED

    turn = pb.Envelope()
    turn.request.id = 1001
    turn.request.turn_start.thread_id = thread_id
    turn.request.turn_start.input.add().text = "hello from python"
    response = client.send_request(turn)
    assert response.code == 0, response.message
    turn_id = response.turn_start.turn.id

    deadline = time.time() + 10
    while not any(n.WhichOneof("payload") == "turn_completed" and n.turn_completed.turn.id == turn_id for n in client.notifications):
        assert time.time() < deadline, "no turn/completed"
        envelope = client.read_envelope()
        if envelope.WhichOneof("kind") == "notification":
            client.notifications.append(envelope.notification)
    sequences = [n.sequence for n in client.notifications]
    assert sequences == list(range(1, len(sequences) + 1))

    read = pb.Envelope()
    read.request.id = 1002
    read.request.thread_read.thread_id = thread_id
    read.request.thread_read.include_turns = True
    read.request.thread_read.include_model_requests = True
    thread = client.send_request(read).thread_read.thread
    assert thread.multi_agent_runtime == pb.ma.MULTI_AGENT_RUNTIME_V2
    last = thread.turns[-1]
    assert last.context.effective_multi_agent_mode == pb.ma.MULTI_AGENT_MODE_PROACTIVE
    kinds = [item.kind for item in last.model_requests[-1].context]
    assert pb.turn.CONTEXT_KIND_MULTI_AGENT_MODE in kinds
    assert [i.text for i in last.items] == ["hello from python", "echo: hello from python"]

    # Clearing is explicit presence: the oneof's bool member.
    update = pb.Envelope()
    update.request.id = 1003
    update.request.thread_settings_update.thread_id = thread_id
    update.request.thread_settings_update.clear_multi_agent_mode = True
    cleared = client.send_request(update).thread_settings_update
    assert cleared.changed
    assert not cleared.settings.HasField("multi_agent_mode")


def test_errors_keep_the_connection(pb, server):
    client = initialized(pb, server)
    garbage = b"\x0a\xff\xff\x01"
    client.send_raw(struct.pack(">BI", 0, len(garbage)) + garbage)
    reply = client.read_envelope()
    assert reply.response.code == 3 and not reply.response.HasField("id")
    unknown = pb.Envelope()
    unknown.request.id = 5
    missing = client.send_request(_with_update(pb, unknown, "nope"))
    assert missing.code == 5
    assert client.call("health_check").code == 0


def _with_update(pb, envelope, thread_id):
    envelope.request.thread_settings_update.thread_id = thread_id
    envelope.request.thread_settings_update.multi_agent_mode = pb.ma.MULTI_AGENT_MODE_PROACTIVE
    return envelope


def test_bad_flags_close_with_an_error_frame(pb, server):
    client = initialized(pb, server)
    client.send_raw(b"\x01\x00\x00\x00\x00")
    reply = client.read_envelope()
    assert reply.response.code == 3 and "flags" in reply.response.message
    assert client.read_envelope() is None  # closed
    other = initialized(pb, server)
    assert other.call("health_check").code == 0
