"""threadwire over WebSocket (--web-listen, path /ws), driven by PyPI's
`websockets`: each binary message one Envelope, the session rules of a TCP
connection."""
import os
import socket
import subprocess
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from conftest import tokens_file, rss_kib, start_listening, stop_server
from threadwire_client import Client, messages

ALICE = "alice-3e5a7c9b1d2f4a6c8e0b"
E = messages.envelope
T = messages.thread
U = messages.turn
H = messages.health


def start(tmp_path, *arguments):
    proc, addresses = start_listening(tmp_path, "--web-listen", "127.0.0.1:0", *arguments)
    addresses["web"] = addresses["web"].replace("http://", "ws://") + "/ws"
    return proc, addresses


stop = stop_server


@pytest.fixture()
def served(tmp_path):
    proc, addresses = start(tmp_path)
    yield proc, addresses
    stop(proc)


def request(request_id, **params):
    return E.Envelope(request=E.Request(id=request_id, **params)).SerializeToString()


def hello(token=None):
    params = H.InitializeParams(client_info=H.ClientInfo(name="ws-test"), protocol_version=1)
    if token:
        params.auth_token = token
    return params


def responses(ws, count):
    """The next `count` responses, and the notifications heard meanwhile."""
    answers, notes = [], []
    while len(answers) < count:
        envelope = E.Envelope.FromString(ws.recv(timeout=20))
        if envelope.WhichOneof("kind") == "response":
            answers.append(envelope.response)
        elif envelope.WhichOneof("kind") == "notification":
            notes.append(envelope.notification)
    return answers, notes


def a_new_session_initializes(addresses):
    with connect(addresses["web"]) as ws:
        ws.send(request(1, initialize=hello()))
        (init,), _ = responses(ws, 1)
        assert init.code == 0


def test_a_session_starts_a_thread_runs_a_turn_and_reads_it(served):
    _, addresses = served
    with connect(addresses["web"]) as ws:
        # Pipelined like on TCP: answered in order.
        ws.send(request(1, initialize=hello()))
        ws.send(request(2, thread_start=T.ThreadStartParams()))
        (init, started), _ = responses(ws, 2)
        assert init.id == 1 and init.code == 0 and init.initialize.protocol_version == 1
        assert started.id == 2 and started.code == 0
        thread_id = started.thread_start.thread.id
        ws.send(request(3, turn_start=U.TurnStartParams(thread_id=thread_id, input=[U.UserInput(text="hello over ws")])))
        (turn,), _ = responses(ws, 1)
        assert turn.code == 0
        # The session is subscribed: the turn's notifications arrive, numbered 1, 2, 3, ...
        heard = []
        while not heard or heard[-1].WhichOneof("payload") != "turn_completed":
            envelope = E.Envelope.FromString(ws.recv(timeout=20))
            if envelope.WhichOneof("kind") == "notification":
                heard.append(envelope.notification)
        sequences = [n.sequence for n in heard]
        assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
        ws.send(request(4, thread_read=T.ThreadReadParams(thread_id=thread_id, include_turns=True)))
        ws.send(request(5, thread_read=T.ThreadReadParams(thread_id="thr_nope")))
        (read, missing), _ = responses(ws, 2)
        assert read.code == 0 and [t.id for t in read.thread_read.thread.turns] == [turn.turn_start.turn.id]
        assert missing.id == 5 and missing.code == 5 and "thr_nope" in missing.message
    # The same thread over TCP.
    host, port = addresses["frames"].rsplit(":", 1)
    with Client(host, int(port)) as client:
        client.initialize()
        assert client.call("thread/read", {"thread_id": thread_id}).thread.id == thread_id


def test_bad_messages_get_the_protocols_answers_and_the_session_goes_on(served):
    _, addresses = served
    with connect(addresses["web"]) as ws:
        ws.send(request(1, thread_start=T.ThreadStartParams()))  # before initialize
        ws.send(b"\x0a\xff\xff\xff\xff\x0f")                    # not an Envelope
        ws.send(request(2, initialize=hello()))
        (early, garbage, init), _ = responses(ws, 3)
        assert early.id == 1 and early.code == 9       # FAILED_PRECONDITION
        assert not garbage.HasField("id") and garbage.code == 3  # INVALID_ARGUMENT
        assert init.id == 2 and init.code == 0
    # A text message is not a frame: the socket closes with 1003.
    with connect(addresses["web"]) as ws:
        ws.send("hello")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1003


def test_fragments_pings_and_the_clients_close(served):
    _, addresses = served
    with connect(addresses["web"]) as ws:
        # One Envelope sent as a message of three fragments is one request.
        whole = request(1, initialize=hello())
        ws.send([whole[:3], whole[3:7], whole[7:]])
        (init,), _ = responses(ws, 1)
        assert init.id == 1 and init.code == 0
        ws.ping(b"are you there").wait(timeout=10)  # the pong came back
        ws.send(request(2, health_check=H.HealthCheckParams()))
        (health,), _ = responses(ws, 1)
        assert health.id == 2 and health.code == 0
        ws.close()
        # The server answered the close handshake with the client's code.
        assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 1000


def test_sigterm_ends_open_sessions_with_a_close_frame_and_the_server_exits(tmp_path):
    proc, addresses = start(tmp_path)
    try:
        with connect(addresses["web"]) as ws:
            ws.send(request(1, initialize=hello()))
            ws.send(request(2, thread_start=T.ThreadStartParams()))
            (_, started), _ = responses(ws, 2)
            assert started.code == 0
            proc.terminate()
            with pytest.raises(ConnectionClosed) as ended:
                while True:
                    ws.recv(timeout=20)
            assert ended.value.rcvd is not None and ended.value.rcvd.code == 1001, ended.value
        assert proc.wait(timeout=20) == 0
    finally:
        stop(proc)


def test_connections_that_sent_no_whole_request_do_not_hold_the_servers_exit(tmp_path):
    """A browser opens sockets ahead of need (preconnect) and may never use
    them: at SIGTERM such a connection, and one whose request head is still
    arriving, is closed, as Hummingbird closes an idle keep-alive connection,
    rather than waited for until the client lets it go."""
    proc, addresses = start(tmp_path)
    host, port = addresses["web"][len("ws://"):].split("/")[0].rsplit(":", 1)
    idle = socket.create_connection((host, int(port)))
    partial = socket.create_connection((host, int(port)))
    try:
        partial.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\n")
        with connect(addresses["web"]) as ws:   # a live session, so the server is past accepting
            ws.send(request(1, initialize=hello()))
            responses(ws, 1)
            proc.terminate()
            try:
                assert proc.wait(timeout=20) == 0
            except subprocess.TimeoutExpired:
                pytest.fail("the server was still running 20 s after SIGTERM, held by the idle and the half-sent connections")
        for sock in (idle, partial):
            sock.settimeout(5)
            assert sock.recv(1024) == b"", "the connection was answered instead of closed"
    finally:
        idle.close()
        partial.close()
        stop(proc)


def test_a_message_over_the_frame_limit_closes_the_socket(tmp_path):
    proc, addresses = start(tmp_path, "--max-frame-bytes", "65536")
    try:
        with connect(addresses["web"], max_size=None) as ws:
            ws.send(b"\x00" * 70000)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd.code == 1009  # message too big
        a_new_session_initializes(addresses)  # others are unaffected
    finally:
        stop(proc)


def test_tokens_and_origins(tmp_path):
    tokens = tokens_file(tmp_path, f"alice {ALICE}\n")
    proc, addresses = start(tmp_path, "--auth-tokens", str(tokens), "--web-allowed-origin", "https://console.example")
    try:
        with connect(addresses["web"]) as ws:
            ws.send(request(1, initialize=hello()))
            (refused,), _ = responses(ws, 1)
            assert refused.code == 16  # UNAUTHENTICATED, then the session ends with a close frame
            with pytest.raises(ConnectionClosed) as ended:
                ws.recv(timeout=10)
            assert ended.value.rcvd.code == 1001 and ended.value.rcvd.reason == "the server ended this session"
        # Until initialize authenticates, messages are held to 64 KiB, as frames on TCP are.
        with connect(addresses["web"], max_size=None) as ws:
            ws.send(b"\x00" * 70000)
            (refused,), _ = responses(ws, 1)
            assert refused.code == 8 and "exceeds the maximum of 65536 bytes" in refused.message  # RESOURCE_EXHAUSTED
            with pytest.raises(ConnectionClosed) as ended:
                ws.recv(timeout=10)
            assert ended.value.rcvd.code == 1001
        with connect(addresses["web"], origin="https://console.example", max_size=None) as ws:
            ws.send(request(1, initialize=hello(ALICE)))
            (init,), _ = responses(ws, 1)
            assert init.code == 0 and init.initialize.principal == "alice"
            # Authenticated, a message may be as large as --max-frame-bytes.
            ws.send(request(2, thread_start=T.ThreadStartParams()))
            (started,), _ = responses(ws, 1)
            ws.send(request(3, turn_start=U.TurnStartParams(thread_id=started.thread_start.thread.id, input=[U.UserInput(text="x" * 70000)])))
            (turn,), _ = responses(ws, 1)
            assert turn.id == 3 and turn.code == 0
        # Non-browser clients that send a ws:// Origin (swift-websocket's does) are let through.
        with connect(addresses["web"], origin="ws://127.0.0.1") as ws:
            ws.send(request(1, initialize=hello(ALICE)))
            (init,), _ = responses(ws, 1)
            assert init.code == 0
        # A page of another origin opens no session: closed at once, saying why.
        for foreign_origin in ("https://evil.example", "null"):
            with connect(addresses["web"], origin=foreign_origin) as ws:
                with pytest.raises(ConnectionClosed) as foreign:
                    ws.send(request(1, initialize=hello(ALICE)))
                    ws.recv(timeout=10)
                assert foreign.value.rcvd.code == 1008 and foreign_origin in foreign.value.rcvd.reason

    finally:
        stop(proc)


def test_a_client_that_never_reads_is_cut_off_and_memory_stays_bounded(tmp_path):
    proc, addresses = start(tmp_path, "--max-notification-backlog-bytes", "65536")
    try:
        ws = connect(addresses["web"], max_queue=1).__enter__()
        ws.send(request(1, initialize=hello()))
        ws.send(request(2, thread_start=T.ThreadStartParams()))
        (_, started), _ = responses(ws, 2)
        thread_id = started.thread_start.thread.id
        baseline = rss_kib(proc.pid)
        host, port = addresses["frames"].rsplit(":", 1)
        produced = 0
        with Client(host, int(port)) as client:
            # The producer hears nothing: only the WebSocket client is subscribed.
            notifications = [n.name for n in client.call("reflection/descriptors").notifications]
            client.initialize(opt_out=notifications)
            for _ in range(120):
                client.call("turn/start", {"thread_id": thread_id, "input": [{"text": "x" * 16384}]})
                deadline = time.monotonic() + 20
                while client.call("thread/read", {"thread_id": thread_id, "include_turns": True}).thread.turns[-1].status == 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                produced += 1
        grown = rss_kib(proc.pid) - baseline
        assert grown < 64 * 1024, f"server RSS grew {grown} KiB while a WebSocket client read nothing"
        received = 0
        with pytest.raises(ConnectionClosed):
            while True:
                ws.recv(timeout=20)
                received += 1
        print(f"never-reading WebSocket client: RSS grew {grown} KiB, {received} messages held, then closed")
        assert received < produced * 3
        ws.close()
    finally:
        stop(proc)


def test_random_messages_never_break_the_server(served):
    """A seeded fuzz of the WebSocket message path: 2,000 random binary
    messages on one session; each gets an answer or the session is ended by
    the server with a close frame; the server keeps serving others."""
    import random
    proc, addresses = served
    rng = random.Random(0x7477)
    with connect(addresses["web"]) as ws:
        try:
            for _ in range(2000):
                ws.send(bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 64))))
            ws.send(request(99, health_check=H.HealthCheckParams()))
            while True:
                envelope = E.Envelope.FromString(ws.recv(timeout=20))
                if envelope.WhichOneof("kind") == "response" and envelope.response.id == 99:
                    break
        except ConnectionClosed as closed:
            assert closed.rcvd is not None, "the server ended the session without a close frame"
    assert proc.poll() is None
    a_new_session_initializes(addresses)


def raw_upgrade(address):
    """A WebSocket opened by hand on a plain socket, for frames a client library would not send."""
    import base64
    import socket
    host, port = address.removeprefix("ws://").removesuffix("/ws").rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=20)
    key = base64.b64encode(os.urandom(16)).decode()
    raw.sendall((f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return raw


def read_until_closed(raw):
    """The server's frames until it closes, as (opcode, payload)."""
    data = b""
    while chunk := raw.recv(65536):
        data += chunk
    frames = []
    while data:
        opcode, length, at = data[0] & 0x0F, data[1] & 0x7F, 2
        if length == 126:
            length, at = int.from_bytes(data[2:4], "big"), 4
        elif length == 127:
            length, at = int.from_bytes(data[2:10], "big"), 10
        frames.append((opcode, data[at:at + length]))
        data = data[at + length:]
    return frames


def test_partial_messages_count_in_the_servers_partial_frame_budget(tmp_path):
    proc, addresses = start(tmp_path, "--max-frame-bytes", "1000000", "--max-partial-frame-bytes", "1000005")
    try:
        # Binary messages announcing 1,000,000 bytes (masked, zero key), sent in part.
        def partial(sent):
            return bytes([0x82, 0x80 | 127]) + (1_000_000).to_bytes(8, "big") + b"\0\0\0\0" + b"x" * sent
        first = raw_upgrade(addresses["web"])
        first.sendall(partial(990_000))
        time.sleep(0.5)
        second = raw_upgrade(addresses["web"])
        # Its last byte would make 1,000,006 held in all, past 1,000,005: refused once
        # the server has read it all (so the close is not a reset losing the answer).
        second.sendall(partial(10_006))
        (refusal_kind, refusal), (close_kind, close) = read_until_closed(second)
        assert refusal_kind == 0x2 and close_kind == 0x8  # one binary message, then a close frame
        envelope = E.Envelope.FromString(refusal)
        assert envelope.response.code == 8 and "max_partial_frame_bytes" in envelope.response.message, envelope
        assert int.from_bytes(close[:2], "big") == 1001
        second.close()
        # The first goes on: the rest of its message is one request (not an Envelope here: INVALID_ARGUMENT).
        first.sendall(b"y" * 10_000)
        first.settimeout(20)
        head = first.recv(2)
        assert head[0] == 0x82, head
        body = first.recv(head[1])
        assert E.Envelope.FromString(body).response.code == 3
        first.close()
        a_new_session_initializes(addresses)
    finally:
        stop(proc)


def test_a_malformed_websocket_frame_gets_a_clean_close(served):
    _, addresses = served
    with raw_upgrade(addresses["web"]) as raw:
        # RSV1 set without a negotiated extension, and unmasked: a protocol error.
        raw.sendall(bytes([0xC2, 0x03]) + b"abc")
        (kind, close), = read_until_closed(raw)  # a close frame, then the end
        assert kind == 0x8
        code = int.from_bytes(close[:2], "big")
        assert code == 1002, code
