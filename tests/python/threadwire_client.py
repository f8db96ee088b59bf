"""A minimal synchronous threadwire client over Google's protobuf runtime."""
import socket
import struct


class Client:
    def __init__(self, pb, host, port):
        self.pb = pb
        self.sock = socket.create_connection((host, port), timeout=10)
        self.next_id = 0
        self.notifications = []
        self.unmatched = []
        self.buffer = b""

    def send_raw(self, data):
        self.sock.sendall(data)

    def send_envelope(self, envelope):
        payload = envelope.SerializeToString()
        self.sock.sendall(struct.pack(">BI", 0, len(payload)) + payload)

    def read_envelope(self):
        while True:
            if len(self.buffer) >= 5:
                flags, length = struct.unpack(">BI", self.buffer[:5])
                assert flags == 0
                if len(self.buffer) >= 5 + length:
                    payload, self.buffer = self.buffer[5:5 + length], self.buffer[5 + length:]
                    envelope = self.pb.Envelope()
                    envelope.ParseFromString(payload)
                    return envelope
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk

    def call(self, method, **fields):
        """Sends a request (method = oneof field name, scalar fields as keywords); returns its Response."""
        self.next_id += 1
        envelope = self.pb.Envelope()
        envelope.request.id = self.next_id
        params = getattr(envelope.request, method)
        params.SetInParent()
        for key, value in fields.items():
            setattr(params, key, value)
        return self.send_request(envelope)

    def send_request(self, envelope):
        self.send_envelope(envelope)
        want = envelope.request.id
        while True:
            reply = self.read_envelope()
            assert reply is not None, "connection closed"
            kind = reply.WhichOneof("kind")
            if kind == "notification":
                self.notifications.append(reply.notification)
            elif kind == "response" and reply.response.HasField("id") and reply.response.id == want:
                return reply.response
            elif kind == "response":
                self.unmatched.append(reply.response)
