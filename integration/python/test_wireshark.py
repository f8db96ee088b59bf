"""contrib/wireshark/threadwire.lua under Debian's tshark, on a loopback
capture of a real session taken during the test: every frame dissected (as
threadwire and, through Wireshark's protobuf dissector, as
threadwire.v1.Envelope), method names and ids visible, and a frame that the
client wrote over several TCP segments reassembled."""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

import pytest

from threadwire_client import Client, messages

ROOT = pathlib.Path(__file__).resolve().parents[2]
DISSECTOR = ROOT / "contrib" / "wireshark" / "threadwire.lua"


def capture_tools():
    missing = [tool for tool in ("dumpcap", "tshark") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (make deps installs Debian's tshark)")
    if os.geteuid() != 0:
        pytest.skip("capturing on the loopback interface needs root (CI runs as root)")


def tshark(capture, port, *arguments):
    """`port` 0 leaves recognition to the dissector's heuristic."""
    command = ["tshark", "-r", str(capture), "-X", f"lua_script:{DISSECTOR}",
               "-o", f'uat:protobuf_search_paths:"{ROOT / "proto"}","TRUE"',
               "-o", f"threadwire.port:{port}", *arguments]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Lua: Error" not in out.stderr and "Error during loading" not in out.stderr, out.stderr
    return out.stdout


def test_tshark_dissects_a_captured_session(server, tmp_path):
    capture_tools()
    host, port = server
    capture = tmp_path / "session.pcapng"
    dumpcap = subprocess.Popen(["dumpcap", "-q", "-i", "lo", "-f", f"tcp port {port}", "-w", str(capture)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not capture.exists() or capture.stat().st_size == 0:
            assert dumpcap.poll() is None, dumpcap.stderr.read()
            assert time.monotonic() < deadline, "dumpcap did not start"
            time.sleep(0.05)
        time.sleep(0.3)

        with Client(host, port) as client:
            client.initialize("wireshark-test")
            thread_id = client.call("thread/start", {"multi_agent_mode": "MULTI_AGENT_MODE_PROACTIVE"}).thread.id
            client.call("turn/start", {"thread_id": thread_id, "input": [{"text": "hello wireshark"}]})
            notifications = 0
            for note in client.iter_notifications():
                notifications += 1
                if note.WhichOneof("payload") == "turn_completed":
                    break
            # Three pipelined requests leave in one segment.
            responses = client.call_many([("thread/read", {"thread_id": thread_id})] * 3)
            assert all(r.code == 0 for r in responses)

            # One frame written in four pieces, each its own TCP segment.
            client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            envelope = messages.envelope.Envelope()
            envelope.request.id = 4242
            envelope.request.thread_list.limit = 7
            payload = envelope.SerializeToString()
            frame = bytes([0]) + len(payload).to_bytes(4, "big") + payload
            for piece in (frame[:2], frame[2:9], frame[9:12], frame[12:]):
                client.sock.sendall(piece)
                time.sleep(0.15)
            assert client.wait(4242).code == 0
            # An error response, so codes show too.
            missing = client.wait(client.send("thread/read", {"thread_id": "no-such-thread"}))
            assert missing.code == 5
            leftover = len(client.notifications)
        time.sleep(0.5)
    finally:
        dumpcap.send_signal(signal.SIGINT)
        dumpcap.wait(timeout=20)

    # Frames each side sent: initialize, thread/start, turn/start, 3 reads,
    # thread/list, one failing read; as many responses; the notifications.
    requests, responses = 8, 8
    rows = tshark(capture, port, "-Y", "threadwire", "-T", "fields", "-E", "separator=|", "-E", "occurrence=a",
                  "-E", "aggregator=;", "-e", "frame.number", "-e", "threadwire.kind", "-e", "threadwire.method",
                  "-e", "threadwire.id", "-e", "threadwire.code", "-e", "tcp.segment.count").splitlines()
    frames = []
    for row in rows:
        number, kinds, methods, ids, codes, segments = row.split("|")
        for kind in kinds.split(";"):
            frames.append({"frame": number, "kind": kind})
    kinds = [f["kind"] for f in frames]
    assert kinds.count("Request") == requests, rows
    assert kinds.count("Response") == responses, rows
    assert kinds.count("Notification") == notifications + leftover, rows

    text = "\n".join(rows)
    for method in ("initialize", "thread/start", "turn/start", "thread/read", "thread/list", "turn/completed", "item/completed"):
        assert method in text, f"{method} not shown: {rows}"
    # The split frame: reassembled from its four segments, id and method shown.
    split = [row.split("|") for row in rows if "thread/list" in row]
    assert len(split) == 2, rows  # the request and its response
    assert split[0][1] == "Request" and split[0][3] == "4242" and split[0][5] == "4", split  # tcp.segment.count
    assert split[1][1] == "Response" and split[1][3] == "4242" and split[1][4] == "0", split
    assert [row for row in rows if "thread/read" in row and "5" in row.split("|")[4].split(";")], "the NOT_FOUND response"

    # Wireshark's protobuf dissector decoded the payload as threadwire.v1.Envelope.
    detail = tshark(capture, port, "-V", "-Y", "threadwire.id == \"4242\" && threadwire.kind == \"Request\"")
    assert "Message: threadwire.v1.Envelope" in detail, detail[-3000:]
    assert "Message: threadwire.v1.ThreadListParams" in detail and "limit = 7" in detail, detail[-3000:]
    full = tshark(capture, port, "-V")
    assert "Malformed" not in full and "Failed to" not in full
    assert "threadwire.bad_payload" not in full

    # Without the port preference the heuristic finds the same frames.
    heuristic = tshark(capture, 0, "-Y", "threadwire", "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=;",
                       "-e", "threadwire.kind").split()
    assert sum(line.split(";").count("Request") for line in heuristic) == requests
    assert sum(line.split(";").count("Notification") for line in heuristic) == notifications + leftover
