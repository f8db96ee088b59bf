"""threadwire over real gRPC (--grpc-listen), driven by an independent client:
grpcio with its health and reflection packages. The client's message classes
come only from what the server's reflection returns (no .proto, no generated
threadwire code)."""
import pathlib
import signal
import subprocess
import time

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from conftest import tokens_file, rss_kib, start_listening, stop_server
from threadwire_client import Client

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVICE = "threadwire.v1.Threadwire"
ALICE = "alice-5d1e9c7a3b8f2e4d6c0a"
BOB = "bob-8e2a4c6e0b1d3f5a7c9e"


def start(tmp_path, *arguments):
    return start_listening(tmp_path, "--grpc-listen", "127.0.0.1:0", *arguments)


stop = stop_server


@pytest.fixture()
def served(tmp_path):
    proc, addresses = start(tmp_path)
    channel = grpc.insecure_channel(addresses["grpc"])
    yield proc, addresses, channel
    channel.close()
    stop(proc)


@pytest.fixture()
def authenticated(tmp_path):
    tokens = tokens_file(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    proc, addresses = start(tmp_path, "--auth-tokens", str(tokens))
    channel = grpc.insecure_channel(addresses["grpc"])
    yield addresses, channel
    channel.close()
    stop(proc)


class Reflected:
    """Unary callables for every rpc of the service, typed from reflection alone."""

    def __init__(self, channel):
        self.pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        self.service = self.pool.FindServiceByName(SERVICE)
        self.channel = channel

    def message(self, type_name, **fields):
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(type_name))(**fields)

    def call(self, rpc, request=None, metadata=None, **fields):
        method = self.service.methods_by_name[rpc]
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        stub = self.channel.unary_unary(f"/{SERVICE}/{rpc}", request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=response_class.FromString)
        return stub(request if request is not None else request_class(**fields), metadata=metadata, timeout=20)


def subscriber(channel, api):
    """The Subscribe stream, its notifications typed from reflection."""
    notification = message_factory.GetMessageClass(api.pool.FindMessageTypeByName("threadwire.v1.Notification"))
    return channel.unary_stream(f"/{SERVICE}/Subscribe", request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=notification.FromString)


def bearer(token):
    return [("authorization", f"Bearer {token}")]


def wait_for(condition, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"waited {seconds} s for {condition}")


def test_reflection_lists_the_services_and_describes_every_method(served):
    _, _, channel = served
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    [answer] = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for s in answer.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} <= names
    reflected = Reflected(channel)
    rpcs = {m.name: (m.input_type.full_name, m.output_type.full_name) for m in reflected.service.methods}
    assert rpcs["ThreadStart"] == ("threadwire.v1.ThreadStartParams", "threadwire.v1.ThreadLifecycleResult")
    assert rpcs["ThreadSettingsUpdate"] == ("threadwire.v1.ThreadSettingsUpdateParams", "threadwire.v1.ThreadSettingsUpdateResult")
    # Every method of the frame protocol, as reflection/descriptors lists them.
    host, port = served[1]["frames"].rsplit(":", 1)
    with Client(host, int(port)) as client:
        fields = {m.field for m in client.call("reflection/descriptors").methods}
    assert {"".join(p.capitalize() for p in f.split("_")) for f in fields} | {"Subscribe", "Connect", "ThreadImportStream"} == set(rpcs)
    assert reflected.service.methods_by_name["Connect"].client_streaming
    imports = reflected.service.methods_by_name["ThreadImportStream"]
    assert imports.client_streaming and not imports.server_streaming
    assert reflected.service.methods_by_name["Subscribe"].server_streaming
    # An unknown symbol is the reflection service's NOT_FOUND, on the same stream.
    [missing] = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.Such")]))
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_reflection_v1_answers_like_v1alpha(served):
    _, _, channel = served
    info = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    [answer] = info(iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=f"{SERVICE}.TurnStart")]))
    files = answer.file_descriptor_response.file_descriptor_proto
    assert len(files) >= 2  # service.proto and what it imports


def test_start_turn_read_over_grpc_from_reflection_only(served):
    _, addresses, channel = served
    api = Reflected(channel)
    started = api.call("ThreadStart", multi_agent_mode=api.pool.FindEnumTypeByName(
        "threadwire.v1.MultiAgentMode").values_by_name["MULTI_AGENT_MODE_PROACTIVE"].number)
    thread_id = started.thread.id
    assert thread_id
    assert api.pool.FindEnumTypeByName("threadwire.v1.MultiAgentMode").values_by_number[started.multi_agent_mode].name == \
        "MULTI_AGENT_MODE_PROACTIVE"
    turn = api.call("TurnStart", thread_id=thread_id, input=[api.message("threadwire.v1.UserInput", text="hello over grpc")])
    assert turn.turn.id
    # A unary call subscribes nothing: the turn's end is read back.
    completed = api.pool.FindEnumTypeByName("threadwire.v1.TurnStatus").values_by_name["TURN_STATUS_COMPLETED"].number

    def finished():
        read = api.call("ThreadRead", thread_id=thread_id, include_turns=True)
        return read if read.thread.turns and read.thread.turns[-1].status == completed else None
    read = wait_for(finished)
    assert read.thread.id == thread_id
    assert [t.id for t in read.thread.turns] == [turn.turn.id]
    # The same thread, seen over the frame protocol.
    host, port = addresses["frames"].rsplit(":", 1)
    with Client(host, int(port)) as client:
        client.initialize()
        assert client.call("thread/read", {"thread_id": thread_id}).thread.id == thread_id


def test_unknown_thread_is_not_found_and_a_bad_message_invalid_argument(served):
    _, _, channel = served
    api = Reflected(channel)
    with pytest.raises(grpc.RpcError) as missing:
        api.call("ThreadRead", thread_id="thr_does_not_exist")
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert "thr_does_not_exist" in missing.value.details()
    with pytest.raises(grpc.RpcError) as empty:
        api.call("ThreadRead")
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "thread_id" in empty.value.details()
    raw = channel.unary_unary(f"/{SERVICE}/ThreadRead", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as garbage:
        raw(b"\x0a\xff\xff\xff\xff\x0f", timeout=10)  # a length running past the message
    assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # The server goes on serving.
    assert api.call("ThreadStart").thread.id


def test_idempotency_key_header_applies_a_retried_start_once(served):
    _, _, channel = served
    api = Reflected(channel)
    key = [("idempotency-key", "grpc-retry-6b1f0c2e")]
    first = api.call("ThreadStart", metadata=key)
    again = api.call("ThreadStart", metadata=key)
    other = api.call("ThreadStart")
    assert first.thread.id == again.thread.id
    assert other.thread.id != first.thread.id
    listed = api.call("ThreadList")
    assert sorted(t.id for t in listed.data) == sorted([first.thread.id, other.thread.id])


def test_tokens_authenticate_calls_and_isolate_principals(authenticated):
    _, channel = authenticated
    api = Reflected(channel)  # reflection needs no token
    with pytest.raises(grpc.RpcError) as anonymous:
        api.call("ThreadStart")
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as wrong:
        api.call("ThreadStart", metadata=bearer("not-a-token-of-this-server"))
    assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
    alices = api.call("ThreadStart", metadata=bearer(ALICE)).thread.id
    assert api.call("ThreadRead", thread_id=alices, metadata=bearer(ALICE)).thread.id == alices
    with pytest.raises(grpc.RpcError) as hidden:
        api.call("ThreadRead", thread_id=alices, metadata=bearer(BOB))
    assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
    assert api.call("Initialize", metadata=bearer(BOB), client_info=api.message("threadwire.v1.ClientInfo", name="grpc")).principal == "bob"
    # The standard health check answers without a token (probes carry none).
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING


def test_health_check_and_watch_turn_not_serving_on_drain(served):
    proc, _, channel = served
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(service=SERVICE)).status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as unknown:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    # A stream open when the drain begins ends with it (it is a frame connection).
    api = Reflected(channel)
    thread_id = api.call("ThreadStart").thread.id
    subscribe = subscriber(channel, api)
    stream = subscribe(api.message("threadwire.v1.ThreadSubscribeParams", thread_id=thread_id, after_thread_sequence=0), timeout=60)
    assert next(stream).WhichOneof("payload") == "thread_started"
    proc.send_signal(signal.SIGTERM)
    statuses = []
    try:
        for answer in watch:
            statuses.append(answer.status)
            if answer.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
    except grpc.RpcError:
        pass
    assert statuses and statuses[-1] == health_pb2.HealthCheckResponse.NOT_SERVING, statuses
    ended = time.monotonic()
    try:
        for _ in stream:
            pass
    except grpc.RpcError as error:
        assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), error
    assert time.monotonic() - ended < 30
    assert proc.wait(timeout=20) == 0


def kept_sequences(notifications):
    return [n.thread_sequence for n in notifications if n.HasField("thread_sequence")]


def test_subscribe_streams_kept_events_from_a_position_then_live_ones(served):
    _, _, channel = served
    api = Reflected(channel)
    subscribe = subscriber(channel, api)
    thread_id = api.call("ThreadStart").thread.id
    api.call("TurnStart", thread_id=thread_id, input=[api.message("threadwire.v1.UserInput", text="first")])
    stream = subscribe(api.message("threadwire.v1.ThreadSubscribeParams", thread_id=thread_id, after_thread_sequence=0), timeout=30)
    heard = []
    for note in stream:
        heard.append(note)
        if note.WhichOneof("payload") == "turn_completed":
            break
    # Everything kept since the start, in commit order, each once.
    assert kept_sequences(heard) == list(range(1, len(kept_sequences(heard)) + 1))
    assert heard[0].WhichOneof("payload") == "thread_started"
    # Then what happens next, live, on the same stream.
    second = api.call("TurnStart", thread_id=thread_id, input=[api.message("threadwire.v1.UserInput", text="second")]).turn.id
    live = []
    for note in stream:
        live.append(note)
        if note.WhichOneof("payload") == "turn_completed":
            break
    assert live[-1].turn_completed.turn.id == second
    assert kept_sequences(heard + live) == list(range(1, len(kept_sequences(heard + live)) + 1))
    stream.cancel()
    with pytest.raises(grpc.RpcError) as missing:
        next(subscribe(api.message("threadwire.v1.ThreadSubscribeParams", thread_id="thr_nope"), timeout=10))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_connect_carries_a_whole_session_of_envelopes(served):
    _, _, channel = served
    api = Reflected(channel)
    envelope = message_factory.GetMessageClass(api.pool.FindMessageTypeByName("threadwire.v1.Envelope"))
    connect = channel.stream_stream(f"/{SERVICE}/Connect", request_serializer=lambda m: m.SerializeToString(),
                                    response_deserializer=envelope.FromString)
    import queue
    outgoing = queue.Queue()

    def requests():
        while True:
            item = outgoing.get()
            if item is None:
                return
            yield item

    def request(request_id, **params):
        return envelope(request=api.message("threadwire.v1.Request", id=request_id, **params))

    session = connect(requests(), timeout=30)
    # Pipelined: initialize and thread/start in one go, answered in order.
    outgoing.put(request(1, initialize=api.message("threadwire.v1.InitializeParams",
                                                   client_info=api.message("threadwire.v1.ClientInfo", name="grpc-connect"))))
    outgoing.put(request(2, thread_start=api.message("threadwire.v1.ThreadStartParams")))
    responses = []
    for message in session:
        if message.WhichOneof("kind") == "response":
            responses.append(message.response)
            if len(responses) == 2:
                break
    assert [r.id for r in responses] == [1, 2] and all(r.code == 0 for r in responses)
    thread_id = responses[1].thread_start.thread.id
    outgoing.put(request(3, turn_start=api.message("threadwire.v1.TurnStartParams", thread_id=thread_id,
                                                   input=[api.message("threadwire.v1.UserInput", text="hi")])))
    # The session was subscribed by its thread/start: it hears the turn.
    kinds = []
    for message in session:
        kind = message.WhichOneof("kind")
        kinds.append(message.notification.WhichOneof("payload") if kind == "notification" else kind)
        if kinds[-1] == "turn_completed":
            break
    assert "response" in kinds and "turn_started" in kinds
    assert [m for m in kinds if m == "response"] == ["response"]
    # An unknown thread is that request's NOT_FOUND; the session goes on.
    outgoing.put(request(4, thread_read=api.message("threadwire.v1.ThreadReadParams", thread_id="thr_nope")))
    outgoing.put(request(5, thread_read=api.message("threadwire.v1.ThreadReadParams", thread_id=thread_id)))
    answers = []
    for message in session:
        if message.WhichOneof("kind") == "response":
            answers.append(message.response)
            if len(answers) == 2:
                break
    assert [(a.id, a.code) for a in answers] == [(4, grpc.StatusCode.NOT_FOUND.value[0]), (5, 0)]
    assert answers[1].thread_read.thread.id == thread_id
    outgoing.put(None)
    session.cancel()


def test_a_subscriber_that_never_reads_is_cut_off_and_memory_stays_bounded(tmp_path):
    proc, addresses = start(tmp_path, "--max-notification-backlog-bytes", "65536")
    channel = grpc.insecure_channel(addresses["grpc"])
    try:
        api = Reflected(channel)
        thread_id = api.call("ThreadStart").thread.id
        subscribe = subscriber(channel, api)
        stream = subscribe(api.message("threadwire.v1.ThreadSubscribeParams", thread_id=thread_id), timeout=300)
        # Subscribed once thread/subscribe answered: its first live event comes with the first turn.
        baseline = rss_kib(proc.pid)
        text = "x" * 16384
        completed = api.pool.FindEnumTypeByName("threadwire.v1.TurnStatus").values_by_name["TURN_STATUS_COMPLETED"].number
        produced = 0
        for _ in range(120):  # about 120 x 3 x 16 KiB of events, far past the 64 KiB backlog
            api.call("TurnStart", thread_id=thread_id, input=[api.message("threadwire.v1.UserInput", text=text)])
            wait_for(lambda: api.call("ThreadRead", thread_id=thread_id, include_turns=True).thread.turns[-1].status == completed)
            produced += 1
        grown = rss_kib(proc.pid) - baseline
        assert grown < 64 * 1024, f"server RSS grew {grown} KiB while a subscriber read nothing"
        # The stream was cut off: what it holds, then a status that says why.
        received = 0
        with pytest.raises(grpc.RpcError) as cut:
            for _ in stream:
                received += 1
        assert cut.value.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE), cut.value
        print(f"never-reading subscriber: RSS grew {grown} KiB, {received} notifications held, then {cut.value.code()}: {cut.value.details()}")
        assert 0 < received < produced * 3
        # Nothing else was affected.
        assert api.call("ThreadRead", thread_id=thread_id).thread.id == thread_id
    finally:
        channel.close()
        stop(proc)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(ROOT / "integration" / "make_test_certs.sh"), str(directory)], check=True)
    return directory


def tls_channel(address, certs, client=None):
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.pem").read_bytes(),
        private_key=(certs / f"{client}.key").read_bytes() if client else None,
        certificate_chain=(certs / f"{client}.pem").read_bytes() if client else None)
    port = address.rsplit(":", 1)[1]
    return grpc.secure_channel(f"localhost:{port}", credentials)


def test_mutual_tls_certificates_name_the_principal_of_calls_and_streams(tmp_path, certs):
    proc, addresses = start(tmp_path, "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                            "--tls-client-ca", str(certs / "ca.pem"))
    try:
        alice = tls_channel(addresses["grpc"], certs, "alice")
        bob = tls_channel(addresses["grpc"], certs, "bob")
        api = Reflected(alice)
        hello = api.call("Initialize", client_info=api.message("threadwire.v1.ClientInfo", name="grpc-tls"))
        assert hello.principal == "alice"
        thread_id = api.call("ThreadStart").thread.id
        # Tenant isolation by certificate: bob cannot see alice's thread.
        with pytest.raises(grpc.RpcError) as hidden:
            Reflected(bob).call("ThreadRead", thread_id=thread_id)
        assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
        # A stream acts as the certificate's principal too (no token anywhere).
        subscribe = subscriber(alice, api)
        stream = subscribe(api.message("threadwire.v1.ThreadSubscribeParams", thread_id=thread_id, after_thread_sequence=0), timeout=30)
        assert next(stream).WhichOneof("payload") == "thread_started"
        stream.cancel()
        bobs = subscriber(bob, api)
        with pytest.raises(grpc.RpcError) as refused:
            next(bobs(api.message("threadwire.v1.ThreadSubscribeParams", thread_id=thread_id), timeout=30))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        # No certificate, or one from another CA: no handshake, no call.
        for client in (None, "mallory"):
            channel = tls_channel(addresses["grpc"], certs, client)
            with pytest.raises(grpc.RpcError) as failed:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            channel.close()
        alice.close()
        bob.close()
    finally:
        stop(proc)


def test_concurrent_acknowledged_starts_survive_kill_9(tmp_path):
    """8 clients start threads at once over gRPC; the server is killed (-9)
    right after the last acknowledgement; restarted on the same store, it
    lists every acknowledged thread."""
    import concurrent.futures
    proc, addresses = start(tmp_path)
    channel = grpc.insecure_channel(addresses["grpc"])
    api = Reflected(channel)

    def starts(_):
        return [api.call("ThreadStart").thread.id for _ in range(10)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        acknowledged = [thread for batch in pool.map(starts, range(8)) for thread in batch]
    proc.kill()
    proc.wait(timeout=10)
    channel.close()
    assert len(set(acknowledged)) == 80
    proc, addresses = start(tmp_path)
    channel = grpc.insecure_channel(addresses["grpc"])
    try:
        api = Reflected(channel)
        listed, cursor = [], None
        while True:
            page = api.call("ThreadList", limit=50, **({"cursor": cursor} if cursor else {}))
            listed += [t.id for t in page.data]
            if not page.HasField("next_cursor"):
                break
            cursor = page.next_cursor
        assert set(acknowledged) <= set(listed)
    finally:
        channel.close()
        stop(proc)


def http2_frames(sock, seconds=10):
    """The HTTP/2 frames the server sends until it closes: (type, flags, stream, payload)."""
    sock.settimeout(seconds)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    frames = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        frames.append((data[3], data[4], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF, data[9:9 + length]))
        data = data[9 + length:]
    return frames


@pytest.mark.parametrize("after_preface, error_code", [
    # DATA on stream 0 is a connection error (RFC 9113, 6.1): PROTOCOL_ERROR.
    (bytes([0, 0, 4, 0x0, 0, 0, 0, 0, 0]) + b"junk", 0x1),
    # HEADERS whose header block is not HPACK: COMPRESSION_ERROR.
    (bytes([0, 0, 4, 0x1, 0x5, 0, 0, 0, 1]) + b"\xff\xff\xff\xff", 0x9),
    # A frame header announcing more than SETTINGS_MAX_FRAME_SIZE (16,384 by
    # default): FRAME_SIZE_ERROR from the header, before its payload is buffered.
    (bytes([0x01, 0x00, 0x00, 0x0, 0, 0, 0, 0, 1]) + b"\0" * 100, 0x6),
], ids=["data-on-stream-0", "bad-hpack", "oversized-frame"])
def test_a_malformed_http2_frame_gets_goaway_and_others_are_served(served, after_preface, error_code):
    import socket
    _, addresses, channel = served
    host, port = addresses["grpc"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0])
        try:
            sock.sendall(preface + after_preface)
        except (BrokenPipeError, ConnectionResetError):
            pass
        frames = http2_frames(sock)
    goaways = [payload for kind, _, _, payload in frames if kind == 0x7]
    assert goaways, f"no GOAWAY before the close, frames: {[f[0] for f in frames]}"
    assert int.from_bytes(goaways[-1][4:8], "big") == error_code
    # The server is unharmed: another connection is served.
    api = Reflected(channel)
    assert api.call("ThreadStart").thread.id


def test_bytes_that_are_not_http2_are_closed_and_others_are_served(served):
    import socket
    _, addresses, channel = served
    host, port = addresses["grpc"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 64)
        sock.settimeout(10)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    # Closed (EOF reached above), with at most a GOAWAY or an HTTP/1 refusal.
    api = Reflected(channel)
    assert api.call("ThreadStart").thread.id
