#!/usr/bin/env python3
"""Issue 49: a subscriber cut off for 10 s from a thread that streams 100
deltas/s resumes after the last event it handled (thread/subscribe with
after_thread_sequence). Measured per cut: time from the request to caught up
(every kept event up to the number the response reports, and the streaming
message's text so far), the bytes it received until then, and the bytes a
subscriber never cut received over the same 10 s (deltas included).

A fake OpenAI-compatible provider (Tests/provider/fake_openai.py) answers
every model call with CHUNKS chunks of 8 bytes, one every 10 ms; a driver
runs turns back to back on one thread. Provider, server and clients share
this machine's cores.

Usage: .build/venv/bin/python Benchmarks/resume_cut.py [SERVER_BIN]   (make bench-resume)
Environment: CUTS (default 5), CUT_SECONDS (10), CHUNKS (200, so 2 s per answer).
"""
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from threadwire_client import Client

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".build/release/threadwire-server")
CUTS = int(os.environ.get("CUTS", "5"))
CUT_SECONDS = float(os.environ.get("CUT_SECONDS", "10"))
CHUNKS = int(os.environ.get("CHUNKS", "200"))


class CountingSocket:
    """The client's socket, counting the bytes received."""

    def __init__(self, sock):
        self.sock = sock
        self.received = 0

    def recv(self, size):
        data = self.sock.recv(size)
        self.received += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self.sock, name)


def connect(port):
    client = Client("127.0.0.1", port, timeout=30)
    client.sock = CountingSocket(client.sock)
    client.initialize()
    return client


def pump(client, seconds):
    """Reads whatever arrives for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            client._pump(deadline)
        except socket.timeout:
            break


def start_provider(work):
    out = open(os.path.join(work, "provider.out"), "w+")
    proc = subprocess.Popen([sys.executable, "-u", os.path.join(ROOT, "Tests/provider/fake_openai.py")], stdout=out)
    for _ in range(100):
        out.seek(0)
        line = out.readline()
        if line.startswith("listening"):
            break
        time.sleep(0.1)
    port = int(line.split()[1])
    chunk = lambda delta, finish=None: json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    events = [{"delay_ms": 10, "data": chunk({"content": "token%02d " % (n % 100)})} for n in range(CHUNKS)]
    events.append({"data": chunk({}, "stop")})
    request = urllib.request.Request(f"http://127.0.0.1:{port}/control/default", data=json.dumps({"events": events}).encode(),
                                     method="POST")
    urllib.request.urlopen(request).read()
    return proc, port


def start_server(work, provider_port):
    config = os.path.join(work, "config.json")
    with open(config, "w") as f:
        json.dump({"model_providers": [{"name": "fake", "base_url": f"http://127.0.0.1:{provider_port}/v1"}],
                   "models": [{"slug": "remote-1", "provider": "fake"}]}, f)
    proc = subprocess.Popen([BINARY, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(work, "data"), "--config", config,
                             "--log-level", "error"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("threadwire listening on "), line
    return proc, int(line.rsplit(":", 1)[1])


def drive(port, thread_id, stop):
    """Turns back to back: each streams CHUNKS deltas at 100/s."""
    client = connect(port)
    client.call("thread/subscribe", {"thread_id": thread_id})
    turns = 0
    while not stop.is_set():
        turn = client.call("turn/start", {"thread_id": thread_id, "input": [{"text": f"turn {turns}"}]}).turn.id
        done = False
        while not done:
            client._pump()
            while client.notifications:
                note = client.notifications.pop(0)
                if note.WhichOneof("payload") == "turn_completed" and note.turn_completed.turn.id == turn:
                    done = True
        turns += 1
    client.close()


class Steady(threading.Thread):
    """A subscriber never cut: (time, bytes received so far) samples."""

    def __init__(self, port, thread_id):
        super().__init__(daemon=True)
        self.client = connect(port)
        self.client.call("thread/subscribe", {"thread_id": thread_id})
        self.samples = []
        self.running = True

    def run(self):
        while self.running:
            pump(self.client, 0.05)
            self.client.notifications.clear()
            self.samples.append((time.monotonic(), self.client.sock.received))

    def received_between(self, start, end):
        before = max((b for t, b in self.samples if t <= start), default=0)
        after = max((b for t, b in self.samples if t <= end), default=0)
        return after - before


def main():
    work = tempfile.mkdtemp(prefix="tw-resume-")
    provider, provider_port = start_provider(work)
    server, port = start_server(work, provider_port)
    try:
        setup = connect(port)
        thread_id = setup.call("thread/start", {"model": "remote-1"}).thread.id
        stop = threading.Event()
        driver = threading.Thread(target=drive, args=(port, thread_id, stop), daemon=True)
        driver.start()
        steady = Steady(port, thread_id)
        steady.start()
        print(f"thread {thread_id}: turns of {CHUNKS} deltas at 100/s; {CUTS} cuts of {CUT_SECONDS:.0f} s")
        print("| cut | events replayed | text so far (bytes) | caught up after (ms) | bytes received to catch up | a never-cut subscriber received meanwhile (bytes) | ratio |")
        print("|---|---|---|---|---|---|---|")
        last = 0
        rows = []
        for cut in range(1, CUTS + 1):
            client = connect(port)
            client.call("thread/subscribe", {"thread_id": thread_id, "after_thread_sequence": last})
            pump(client, 2.0)
            for note in client.notifications:
                if note.HasField("thread_sequence"):
                    last = max(last, note.thread_sequence)
            client.close()
            cut_at = time.monotonic()
            time.sleep(CUT_SECONDS)

            client = connect(port)
            base = client.sock.received
            began = time.monotonic()
            request = client.send("thread/subscribe", {"thread_id": thread_id, "after_thread_sequence": last})
            response = client.wait(request)
            assert response.code == 0, response.message
            head = response.thread_subscribe.thread.thread_sequence
            replayed, joined, seen = 0, 0, last
            streaming = None
            while seen < head or streaming is None:
                while client.notifications:
                    note = client.notifications.pop(0)
                    kind = note.WhichOneof("payload")
                    if note.HasField("thread_sequence"):
                        assert note.thread_sequence == seen + 1, f"gap: {seen} then {note.thread_sequence}"
                        seen = note.thread_sequence
                        replayed += 1 if seen <= head else 0
                    elif kind == "item_agent_message_delta" and streaming is None:
                        # The first delta after the replay is the text so far (or a live one between answers).
                        streaming = len(note.item_agent_message_delta.delta)
                if seen < head or streaming is None:
                    client._pump(time.monotonic() + 10)
            caught = time.monotonic()
            bytes_caught = client.sock.received - base
            meanwhile = steady.received_between(cut_at, began)
            rows.append((replayed, streaming, (caught - began) * 1e3, bytes_caught, meanwhile))
            print(f"| {cut} | {replayed} | {streaming} | {(caught - began) * 1e3:.1f} | {bytes_caught} | {meanwhile} | "
                  f"{bytes_caught / max(1, meanwhile):.2f} |")
            last = seen
            client.close()
        print(f"\nmedians: caught up after {statistics.median(r[2] for r in rows):.1f} ms, "
              f"{statistics.median(r[3] for r in rows):.0f} bytes to catch up against "
              f"{statistics.median(r[4] for r in rows):.0f} bytes a never-cut subscriber received over the cut")
        stop.set()
        steady.running = False
    finally:
        server.terminate()
        provider.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
