#!/usr/bin/env python3
"""A scripted OpenAI-compatible Chat Completions server for threadwire's tests
and benchmarks (standard library only).

    python3 fake_openai.py [--port N] [--exit-on-stdin-eof]     prints "listening PORT" once bound

Every POST /v1/chat/completions (or /v1/responses) takes the next scripted
response (FIFO) and is recorded; "path" in the record says which. Control endpoints:

    POST /control/script    {"responses": [RESPONSE, ...]}   appends to the queue
    POST /control/default   RESPONSE                          used when the queue is empty
    GET  /control/requests  every recorded request: {"headers", "body", "events_sent", "disconnected"}

RESPONSE:
    {"status": 200,                      HTTP status (default 200)
     "headers": {"Retry-After": "1"},    extra headers
     "body": "text",                     body of a non-streamed (e.g. error) answer
     "events": [{"delay_ms": 10, "data": "{...}"} | {"delay_ms": 10, "raw": "bytes as text"}],
     "done": true,                       send "data: [DONE]" after the events (default true)
     "stall": false,                     after the events, send nothing more and keep the
                                         connection open until the client goes away
     "echo_timestamps": false,           replace "{ts}" in data with time.time_ns()
     "match": "text",                    only for a request whose body contains this text
     "head_delay_ms": 0}                 wait this long before the status line
"""
import argparse
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
queue = []
default = {"status": 500, "body": "no scripted response"}
recorded = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def reply_json(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/control/requests":
            with lock:
                self.reply_json(200, recorded)
        else:
            self.reply_json(404, {"error": "not found"})

    def do_POST(self):
        global default
        raw = self.read_body()
        if self.path == "/control/script":
            with lock:
                queue.extend(json.loads(raw)["responses"])
            return self.reply_json(200, {"queued": len(queue)})
        if self.path == "/control/default":
            with lock:
                default = json.loads(raw)
            return self.reply_json(200, {})
        if not (self.path.endswith("/chat/completions") or self.path.endswith("/responses")):
            return self.reply_json(404, {"error": {"message": "unknown path " + self.path}})
        entry = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "events_sent": 0,
                 "disconnected": False}
        try:
            entry["body"] = json.loads(raw)
        except ValueError:
            entry["body"] = raw.decode("utf-8", "replace")
        text = raw.decode("utf-8", "replace")
        with lock:
            recorded.append(entry)
            # A response with "match" goes to the first request whose body
            # contains that text; others are served in order.
            index = next((i for i, r in enumerate(queue) if "match" in r and r["match"] in text), None)
            if index is None:
                index = next((i for i, r in enumerate(queue) if "match" not in r), None)
            response = queue.pop(index) if index is not None else default
        self.serve(response, entry)

    def serve(self, response, entry):
        if response.get("head_delay_ms") and self.client_gone(response["head_delay_ms"] / 1000.0):
            entry["disconnected"] = True
            return
        status = response.get("status", 200)
        self.send_response(status)
        for name, value in response.get("headers", {}).items():
            self.send_header(name, value)
        if status != 200 or "body" in response:
            data = response.get("body", "").encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.flush()
        events = list(response.get("events", []))
        if response.get("done", True):
            events.append({"data": "[DONE]"})
        try:
            for event in events:
                delay = event.get("delay_ms", 0)
                if delay and self.client_gone(delay / 1000.0):
                    entry["disconnected"] = True
                    return
                if "raw" in event:
                    payload = event["raw"]
                else:
                    data = event["data"]
                    if response.get("echo_timestamps"):
                        data = data.replace("{ts}", str(time.time_ns()))
                    payload = "data: " + data + "\n\n"
                self.wfile.write(payload.encode())
                self.wfile.flush()
                entry["events_sent"] += 1
            if response.get("stall"):
                while not self.client_gone(0.05):
                    pass
                entry["disconnected"] = True
        except (BrokenPipeError, ConnectionResetError):
            entry["disconnected"] = True

    def client_gone(self, seconds):
        """Waits up to `seconds`; True once the client closed its side."""
        sock = self.connection
        readable, _, _ = select.select([sock], [], [], seconds)
        if not readable:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except (ConnectionResetError, OSError):
            return True


def main():
    # Threads give up the interpreter lock only when they block (select,
    # socket writes), not every 5 ms: a chunk's timestamp is then taken right
    # before its write, whatever the other streams do.
    sys.setswitchinterval(1.0)
    # A parent that blocks these signals (a test process may) would pass the
    # block on, and SIGTERM would never end this server.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--exit-on-stdin-eof", action="store_true",
                        help="exit once standard input closes (the parent went away, even by a crash)")
    args = parser.parse_args()
    if args.exit_on_stdin_eof:
        def watch():
            while sys.stdin.buffer.read(4096):
                pass
            os._exit(0)
        threading.Thread(target=watch, daemon=True).start()
    # socketserver listens with a backlog of 5: a server opening tens of
    # streams at once overflowed it, and each dropped connect waited for TCP
    # to retry it (1 s, then 3 s, ...).
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print("listening", server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
