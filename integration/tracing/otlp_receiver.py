"""A real OTLP/HTTP trace receiver for the tests: POST /v1/traces bodies are
decoded with opentelemetry-proto (the protobuf the OpenTelemetry collector
itself reads) and each span is appended to a file as one JSON line.

Usage: otlp_receiver.py SPANS_FILE PORT_FILE [--delay-ms N] [--discard]
The bound port is written to PORT_FILE once listening. With --delay-ms each
export is answered that late (a slow collector). With --discard exports are
answered without decoding (the benchmarks' collector, which must not compete
with the server for CPU)."""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

lock = threading.Lock()


def value_of(any_value):
    """Every attribute value as a string (booleans as true/false), so the tests compare text."""
    kind = any_value.WhichOneof("value")
    if not kind:
        return None
    value = getattr(any_value, kind)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def spans_of(request):
    for resource_spans in request.resource_spans:
        resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "service": resource.get("service.name"),
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "kind": span.kind,
                    "status": span.status.code,
                    "attributes": {a.key: value_of(a.value) for a in span.attributes},
                    "start": span.start_time_unix_nano,
                    "end": span.end_time_unix_nano,
                }


def main():
    spans_file, port_file = sys.argv[1], sys.argv[2]
    delay = int(sys.argv[sys.argv.index("--delay-ms") + 1]) / 1000 if "--delay-ms" in sys.argv else 0
    discard = "--discard" in sys.argv

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            if delay:
                time.sleep(delay)
            if not discard:
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                lines = "".join(json.dumps(span) + "\n" for span in spans_of(request))
                with lock, open(spans_file, "a") as out:
                    out.write(lines)
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file + ".tmp", "w") as out:
        out.write(str(server.server_address[1]))
    import os
    os.rename(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
