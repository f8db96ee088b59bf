"""A small synchronous client: connect, initialize, call any method (with
pipelining), iterate notifications, and answer what the server asks while a
turn runs (client tools, approvals, user input) from handlers that run on
worker threads."""
import importlib
import json
import math
import random
import socket
import ssl
import struct
import sys
import threading
import time
import types
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

# The generated modules import each other as `threadwire.v1.*`.
sys.path.insert(0, str(Path(__file__).resolve().parent / "gen"))
messages = types.SimpleNamespace(**{
    name: importlib.import_module(f"threadwire.v1.{name}_pb2")
    for name in ("envelope", "health", "multi_agent", "server_request", "settings", "thread", "turn")
})

HEADER = struct.Struct(">BI")


class StatusError(Exception):
    """A non-OK response."""

    def __init__(self, code, message):
        super().__init__(f"status {code}: {message}")
        self.code = code
        self.message = message


def tls_context(ca_file=None, cert_file=None, key_file=None):
    """A client TLS context: the server verified against `ca_file` (the
    system's CA certificates when None); `cert_file` and `key_file` present a
    client certificate (mutual TLS)."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context


class Schema:
    """The server's contract as reflection/descriptors returns it: message
    classes built from its FileDescriptorSet, so any method it offers can be
    called without generated code (see Client.call_dict)."""

    def __init__(self, result):
        pool = descriptor_pool.DescriptorPool()
        for file in descriptor_pb2.FileDescriptorSet.FromString(result.file_descriptor_set).file:
            pool.Add(file)
        self.envelope = message_factory.GetMessageClass(pool.FindMessageTypeByName(result.envelope_type))
        self.protocol_version = result.protocol_version
        self.methods = {m.name: m for m in result.methods}
        self.notifications = {m.field: m.name for m in result.notifications}
        self.server_requests = {m.field: m.name for m in result.server_requests}

    def notification_to_dict(self, notification):
        """(method name, params dict) of a received Notification."""
        dynamic = self.envelope.FromString(messages.envelope.Envelope(notification=notification).SerializeToString())
        field = dynamic.notification.WhichOneof("payload")
        return self.notifications.get(field, field), _to_dict(getattr(dynamic.notification, field))


def _to_dict(message):
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


class Client:
    """`tls`: an ssl.SSLContext (see `tls_context`) to speak TLS; the server
    certificate must name `server_hostname` (default: `host`)."""

    def __init__(self, host="127.0.0.1", port=7420, timeout=30.0, tls=None, server_hostname=None):
        sock = socket.create_connection((host, port), timeout=timeout)
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname=server_hostname or host)
        self.sock = sock
        self._buffer = b""
        self._init_state(timeout)

    def _init_state(self, timeout):
        self._next_id = 0
        self._responses = {}
        self.notifications = []  # received but not yet consumed
        self.unmatched = []      # responses without a known id (protocol errors)
        self.server_requests = []  # server requests no handler took
        self._tools = {}
        self._approval = None
        self._user_input = None
        self._workers = None
        self._write_lock = threading.Lock()
        self._schema = None
        self._timeout = timeout
        self._deadlines = {}  # request id -> time.monotonic() deadline
        self._abandoned = set()  # ids whose deadline passed before their answer

    # -- framing -----------------------------------------------------------
    def send_frame(self, payload: bytes):
        # Handlers answer from worker threads: one frame at a time on the socket.
        with self._write_lock:
            self.sock.sendall(HEADER.pack(0, len(payload)) + payload)

    def _read_envelope(self):
        while True:
            if len(self._buffer) >= HEADER.size:
                flags, length = HEADER.unpack_from(self._buffer)
                if len(self._buffer) >= HEADER.size + length:
                    payload = self._buffer[HEADER.size:HEADER.size + length]
                    self._buffer = self._buffer[HEADER.size + length:]
                    envelope = messages.envelope.Envelope()
                    envelope.ParseFromString(payload)
                    return envelope
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self._buffer += chunk

    def _read_envelope_until(self, deadline):
        """The next envelope; socket.timeout (TimeoutError) past `deadline`."""
        if deadline is not None:
            self.sock.settimeout(max(0.0001, deadline - time.monotonic()))
        try:
            return self._read_envelope()
        finally:
            if deadline is not None:
                self.sock.settimeout(self._timeout)

    def _pump(self, deadline=None):
        envelope = self._read_envelope_until(deadline)
        kind = envelope.WhichOneof("kind")
        if kind == "notification":
            self.notifications.append(envelope.notification)
        elif kind == "server_request":
            self._dispatch(envelope.server_request)
        elif kind == "response":
            response = envelope.response
            if response.HasField("id"):
                if response.id in self._abandoned:
                    self._abandoned.discard(response.id)
                    return
                deadline = self._deadlines.get(response.id)
                if deadline is not None and time.monotonic() > deadline:
                    self._responses[response.id] = self._deadline_passed(response.id)
                    self._abandoned.discard(response.id)
                    return
                self._responses[response.id] = response
            else:
                self.unmatched.append(response)

    # -- calls ---------------------------------------------------------------
    def _request(self, method, params):
        """An Envelope for `method` ("thread/start") with params as a dict or message."""
        field = method.replace("/", "_")
        self._next_id += 1
        envelope = messages.envelope.Envelope()
        envelope.request.id = self._next_id
        target = getattr(envelope.request, field)
        target.SetInParent()
        if isinstance(params, dict):
            json_format.ParseDict(params, target)
        elif params is not None:
            target.CopyFrom(params)
        return envelope

    def send(self, method, params=None, timeout=None, idempotency_key=None):
        """Sends without waiting; returns the request id. `timeout` (seconds)
        is sent as timeout_ms and bounds the wait: an answer that has not
        arrived by then is a DEADLINE_EXCEEDED (4) response made here.
        `idempotency_key` makes a change safe to send again (see
        Request.idempotency_key and ReconnectingClient)."""
        envelope = self._request(method, params)
        if idempotency_key is not None:
            envelope.request.idempotency_key = idempotency_key
        if timeout is not None:
            envelope.request.timeout_ms = max(1, math.ceil(timeout * 1000))
            self._deadlines[envelope.request.id] = time.monotonic() + timeout
        self.send_frame(envelope.SerializeToString())
        return envelope.request.id

    def wait(self, request_id):
        """The Response for `request_id` (any status)."""
        deadline = self._deadlines.get(request_id)
        try:
            while request_id not in self._responses:
                if deadline is not None and time.monotonic() >= deadline:
                    return self._deadline_passed(request_id)
                self._pump(deadline)
        except socket.timeout:
            if deadline is None:
                raise
            return self._deadline_passed(request_id)
        self._deadlines.pop(request_id, None)
        return self._responses.pop(request_id)

    def _deadline_passed(self, request_id):
        self._deadlines.pop(request_id, None)
        self._abandoned.add(request_id)  # its answer, when it comes, is dropped
        response = messages.envelope.Response(id=request_id, code=4)
        response.message = "no response within the deadline (the client's)"
        return response

    def call(self, method, params=None, timeout=None, idempotency_key=None):
        """Calls a method and returns its result message; raises StatusError on
        failure (DEADLINE_EXCEEDED past `timeout` seconds)."""
        response = self.wait(self.send(method, params, timeout, idempotency_key))
        if response.code != 0:
            raise StatusError(response.code, response.message)
        return getattr(response, response.WhichOneof("result"))

    def schema(self):
        """The server's Schema (reflection/descriptors, fetched once; works
        before initialize)."""
        if self._schema is None:
            self._schema = Schema(self.call("reflection/descriptors"))
        return self._schema

    def notification_method(self, notification):
        """The wire name of a notification ("thread/rolled_back"), from the
        server's reflected schema."""
        field = notification.WhichOneof("payload")
        return self.schema().notifications.get(field, field)

    def call_dict(self, method, params=None):
        """Calls any method the server offers, found through its reflected
        schema rather than this package's generated code: `params` and the
        result are dicts with the .proto field names. Raises StatusError on a
        non-OK response and ValueError for a method the server does not have."""
        schema = self.schema()
        spec = schema.methods.get(method)
        if spec is None:
            raise ValueError(f"the server has no method {method!r}; it has: {', '.join(sorted(schema.methods))}")
        self._next_id += 1
        envelope = schema.envelope()
        envelope.request.id = self._next_id
        target = getattr(envelope.request, spec.field)
        target.SetInParent()
        json_format.ParseDict(params or {}, target)
        self.send_frame(envelope.SerializeToString())
        response = self.wait(envelope.request.id)
        if response.code != 0:
            raise StatusError(response.code, response.message)
        # Fields this package's code does not know survive as unknown fields
        # of the compiled Envelope; the reflected one reads them.
        dynamic = schema.envelope.FromString(messages.envelope.Envelope(response=response).SerializeToString())
        return _to_dict(getattr(dynamic.response, spec.field))

    def call_many(self, calls):
        """Pipelines [(method, params), ...]: all sent first, responses in order."""
        ids = [self.send(method, params) for method, params in calls]
        return [self.wait(i) for i in ids]

    def initialize(self, name="threadwire-python", opt_out=(), auth_token=None,
                   client_tools=None, approvals=None, user_input=None):
        """`auth_token`: the bearer token of a server that authenticates. The
        capabilities default to what handlers are registered for (register
        them first): the server asks only connections that declared them."""
        params = {
            "client_info": {"name": name, "version": "0.1.0"},
            "protocol_version": 1,
            "capabilities": {
                "opt_out_notification_methods": list(opt_out),
                "client_tools": bool(self._tools) if client_tools is None else client_tools,
                "approvals": (self._approval is not None) if approvals is None else approvals,
                "user_input": (self._user_input is not None) if user_input is None else user_input,
            },
        }
        if auth_token is not None:
            params["auth_token"] = auth_token
        return self.call("initialize", params)

    # -- server requests ----------------------------------------------------
    def on_tool(self, name, handler):
        """Serves client tool `name`: handler(arguments: dict) returns the
        output (str); an exception is a failed call the model reads."""
        self._tools[name] = handler

    def on_approval(self, handler):
        """handler(request, params) returns "approve", "approve_for_tree",
        "cancel", or ("decline", reason). `request.thread_id`,
        `request.task_path` and `request.root_thread_id` name the agent."""
        self._approval = handler

    def on_user_input(self, handler):
        """handler(question: str, choices: list[str]) returns the answer (str)."""
        self._user_input = handler

    def answer(self, request_id, code=0, message="", **result):
        """Answers a server request by hand; `result` is one of
        item_tool_call={...}, item_tool_request_approval={...},
        item_tool_request_user_input={...} (dicts as in the .proto)."""
        envelope = messages.envelope.Envelope()
        answer = envelope.server_request_answer
        answer.id = request_id
        answer.code = code
        if message:
            answer.message = message
        for field, value in result.items():
            json_format.ParseDict(value, getattr(answer, field))
        self.send_frame(envelope.SerializeToString())

    def _dispatch(self, request):
        method = request.WhichOneof("params")
        handler = {"item_tool_call": self._tools, "item_tool_request_approval": self._approval,
                   "item_tool_request_user_input": self._user_input}.get(method)
        if not handler:
            self.server_requests.append(request)
            return
        if self._workers is None:
            self._workers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="threadwire-requests")
        self._workers.submit(self._serve, request, method)

    def _serve(self, request, method):
        try:
            if method == "item_tool_call":
                call = request.item_tool_call
                tool = self._tools.get(call.tool)
                if tool is None:
                    self.answer(request.id, code=12, message=f"this client has no handler for tool {call.tool}")
                    return
                try:
                    output, is_error = str(tool(json.loads(call.arguments or "{}"))), False
                except Exception as error:  # the model reads the failure
                    output, is_error = f"{type(error).__name__}: {error}", True
                self.answer(request.id, item_tool_call={"output": output, "is_error": is_error})
            elif method == "item_tool_request_approval":
                decision = self._approval(request, request.item_tool_request_approval)
                reason = ""
                if isinstance(decision, tuple):
                    decision, reason = decision
                self.answer(request.id, item_tool_request_approval={
                    "decision": "APPROVAL_DECISION_" + decision.upper(), "reason": reason})
            else:
                params = request.item_tool_request_user_input
                answer = self._user_input(params.question, list(params.choices))
                self.answer(request.id, item_tool_request_user_input={"answer": str(answer)})
        except Exception as error:
            self.answer(request.id, code=13, message=f"{type(error).__name__}: {error}")

    def iter_notifications(self):
        """Yields notifications as they arrive (blocks between them)."""
        while True:
            while self.notifications:
                yield self.notifications.pop(0)
            self._pump()

    def _stop_workers(self):
        if self._workers is not None:
            self._workers.shutdown(wait=True)

    def close(self):
        self._stop_workers()
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class WebSocketClient(Client):
    """The same client over a WebSocket (the server's --web-listen):
    `url` is ws://HOST:PORT/ws; each binary message is one Envelope.
    Needs PyPI's `websockets`."""

    def __init__(self, url, timeout=30.0, origin=None):
        from websockets.sync.client import connect
        self.ws = connect(url, origin=origin, max_size=None, open_timeout=timeout)
        self._init_state(timeout)

    def send_frame(self, payload: bytes):
        with self._write_lock:
            self.ws.send(payload)

    def _read_envelope_until(self, deadline):
        from websockets.exceptions import ConnectionClosed
        timeout = self._timeout if deadline is None else max(0.0001, deadline - time.monotonic())
        try:
            data = self.ws.recv(timeout=timeout)
        except ConnectionClosed as closed:
            raise ConnectionError(f"the server closed the session: {closed}") from closed
        envelope = messages.envelope.Envelope()
        envelope.ParseFromString(data)
        return envelope

    def close(self):
        self._stop_workers()
        self.ws.close()


class GRPCConnectClient(Client):
    """The same client over gRPC (the server's --grpc-listen): one
    threadwire.v1.Threadwire/Connect stream carries the session, each message
    one Envelope. `target` is HOST:PORT. Needs PyPI's `grpcio`."""

    def __init__(self, target, timeout=30.0, metadata=None):
        import queue

        import grpc
        self._queue = queue
        self.channel = grpc.insecure_channel(target)
        self._outgoing = queue.Queue()
        self._incoming = queue.Queue()

        def requests():
            while True:
                item = self._outgoing.get()
                if item is None:
                    return
                yield item

        connect = self.channel.stream_stream("/threadwire.v1.Threadwire/Connect",
                                             request_serializer=lambda b: b, response_deserializer=lambda b: b)
        self._call = connect(requests(), metadata=metadata)

        def receive():
            try:
                for message in self._call:
                    self._incoming.put(message)
            except grpc.RpcError as error:
                self._incoming.put(error)
            self._incoming.put(None)

        threading.Thread(target=receive, daemon=True).start()
        self._init_state(timeout)

    def send_frame(self, payload: bytes):
        self._outgoing.put(payload)

    def _read_envelope_until(self, deadline):
        timeout = self._timeout if deadline is None else max(0.0001, deadline - time.monotonic())
        try:
            item = self._incoming.get(timeout=timeout)
        except self._queue.Empty:
            raise socket.timeout("no envelope within the deadline") from None
        if item is None or isinstance(item, Exception):
            self._incoming.put(item)  # stays ended for later reads
            raise ConnectionError(f"the server closed the session: {item}")
        envelope = messages.envelope.Envelope()
        envelope.ParseFromString(item)
        return envelope

    def close(self):
        self._stop_workers()
        self._outgoing.put(None)
        self._call.cancel()
        self.channel.close()


# Methods that change state, for servers whose reflection does not say
# (reflection/descriptors marks each method's `mutates`).
MUTATING_METHODS = frozenset({
    "thread/start", "thread/resume", "thread/fork", "thread/archive", "thread/unarchive", "thread/unsubscribe",
    "thread/settings/update", "agent/spawn", "thread/tools/update", "thread/compact/start", "thread/rollback", "thread/revert", "thread/queue/update", "thread/queue/delete", "thread/queue/reorder", "thread/delete",
    "thread/name/set", "turn/start", "turn/interrupt", "turn/steer", "turn/continue", "thread/import",
})


def _close_socket(client):
    """Closes a connection that may be broken already (no shutdown)."""
    if client is not None:
        try:
            client.sock.close()
        except OSError:
            pass


class RetryPolicy:
    """gRPC's retry policy: up to `max_attempts` in all after UNAVAILABLE
    (14) or a lost connection, with exponential backoff and full jitter."""

    def __init__(self, max_attempts=5, initial_backoff=0.1, max_backoff=5.0, multiplier=2.0, retryable_codes=(14,)):
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.multiplier = multiplier
        self.retryable_codes = frozenset(retryable_codes)

    def pause(self, attempt):
        """Seconds to wait before attempt `attempt` (2, 3, ...)."""
        ceiling = min(self.max_backoff, self.initial_backoff * self.multiplier ** max(0, attempt - 2))
        return random.uniform(0, ceiling)


class ReconnectingClient:
    """Calls that outlive a connection. `connect()` returns a new initialized
    Client (it may pick another instance each time); it is called when there
    is no connection or the last one was lost. A change is sent with one
    idempotency key (a new UUID unless given) on every attempt, so the server
    applies it once however many attempts reach it. Subscriptions belong to a
    connection: after a reconnect (`connections` grew), resume the threads."""

    def __init__(self, connect, policy=None):
        self._connect = connect
        self.policy = policy or RetryPolicy()
        self.client = None
        self.connections = 0

    def _current(self):
        if self.client is None:
            self.client = self._connect()
            self.connections += 1
        return self.client

    def _drop(self):
        _close_socket(self.client)
        self.client = None

    def mutates(self, method):
        try:
            spec = self._current().schema().methods.get(method)
        except (StatusError, OSError, ConnectionError):
            spec = None
        return spec.mutates if spec is not None and spec.HasField("mutates") else method in MUTATING_METHODS

    def response(self, method, params=None, timeout=None, idempotency_key=None, on_attempt=None):
        """The last Response (any status) after the policy's attempts.
        `on_attempt(attempt, key)` is called before each attempt is sent.
        Raises the connection error when no attempt got an answer."""
        key = idempotency_key
        if key is None and self.mutates(method):
            key = str(uuid.uuid4())
        attempt = 1
        while True:
            try:
                if on_attempt is not None:
                    on_attempt(attempt, key)
                client = self._current()
                response = client.wait(client.send(method, params, timeout, key))
                if response.code not in self.policy.retryable_codes or attempt >= self.policy.max_attempts:
                    return response
            except (OSError, ConnectionError):
                # No connection, or it broke mid-call: the outcome is unknown,
                # which the key makes safe to send again.
                self._drop()
                if attempt >= self.policy.max_attempts:
                    raise
            attempt += 1
            time.sleep(self.policy.pause(attempt))

    def call(self, method, params=None, timeout=None, idempotency_key=None):
        """Like Client.call, retried."""
        response = self.response(method, params, timeout, idempotency_key)
        if response.code != 0:
            raise StatusError(response.code, response.message)
        return getattr(response, response.WhichOneof("result"))

    def close(self):
        if self.client is not None:
            self.client.close()
            self.client = None


def notification_thread_id(notification):
    """The thread a notification is about (None for none)."""
    payload = notification.WhichOneof("payload")
    if payload is None:
        return None
    body = getattr(notification, payload)
    if payload == "thread_started":
        return body.thread.id if body.HasField("thread") else None
    return body.thread_id if body.HasField("thread_id") else None


class ResumingSubscription:
    """Subscribes to threads over a connection made again whenever one ends
    (a restart, a failover, a proxy cutting it, the server cutting a reader
    that fell behind), each time resuming every thread after the last
    numbered event it yielded (`thread/resume` with `after_thread_sequence`).
    Iterating yields each kept event once, in order; notifications that are
    not kept (deltas) pass through as they come; thread/closed is left out,
    since the subscription goes on. Child agents a subscribed root spawns are
    resumed too, each after its own number, and those spawned while the
    connection was down from their first event (found with thread/list by
    parent after each resume).

    `connect()` returns a new initialized Client. `after` maps thread ids to
    the positions to start from (a thread not in it starts from its newest
    event). `on_gap(thread_id, message)` is called when a thread's next event
    is no longer kept: the application re-reads the thread; the subscription
    goes on from its newest event."""

    def __init__(self, threads, connect, after=None, policy=None, on_gap=None):
        self.threads = list(threads)
        self._connect = connect
        self.last = dict(after or {})
        self.policy = policy or RetryPolicy(max_attempts=1 << 30)
        self.on_gap = on_gap or (lambda thread_id, message: None)
        self.connections = 0
        self.client = None

    def _resume(self, client, thread_id):
        """Resumes the thread, then its child agents not heard of yet: from
        their first event when the thread resumed from a position (they were
        spawned while this subscription was away), else from their newest."""
        following = thread_id in self.last
        self._resume_one(client, thread_id)
        cursor = None
        while True:
            params = {"parent_thread_id": thread_id, "limit": 100}
            if cursor:
                params["cursor"] = cursor
            page = client.call("thread/list", params)
            for child in page.data:
                if child.id not in self.last:
                    if following:
                        self.last[child.id] = 0
                    self._resume(client, child.id)
            cursor = page.next_cursor
            if not cursor:
                return True

    def _resume_one(self, client, thread_id):
        params = {"thread_id": thread_id, "exclude_turns": True}
        if thread_id in self.last:
            params["after_thread_sequence"] = self.last[thread_id]
        response = client.wait(client.send("thread/resume", params))
        if response.code == 11:  # OUT_OF_RANGE: go on from the newest
            self.on_gap(thread_id, response.message)
            self.last.pop(thread_id, None)
            return self._resume_one(client, thread_id)
        if response.code != 0:
            raise StatusError(response.code, response.message)
        if thread_id not in self.last:
            self.last[thread_id] = response.thread_resume.thread.thread_sequence
        return True

    def __iter__(self):
        attempt = 1
        while True:
            if attempt > 1:
                time.sleep(self.policy.pause(min(attempt, 32)))
            attempt += 1
            try:
                self.client = self._connect()
                self.connections += 1
                for thread_id in self.threads + sorted(set(self.last) - set(self.threads)):
                    self._resume(self.client, thread_id)
                attempt = 1
                for notification in self.client.iter_notifications():
                    if notification.WhichOneof("payload") == "thread_closed":
                        continue
                    thread_id = notification_thread_id(notification)
                    if notification.HasField("thread_sequence") and thread_id is not None:
                        if notification.thread_sequence <= self.last.get(thread_id, 0):
                            continue  # heard before the cut
                        self.last[thread_id] = notification.thread_sequence
                    yield notification
            except (OSError, ConnectionError, StatusError):
                pass
            finally:
                _close_socket(self.client)
                self.client = None
