"""An MCP tool server (stdio, newline-delimited JSON-RPC) that fails on
purpose, for threadwire's fault tests. Plain Python, no SDK, so its
behaviour does not move with the SDK's releases.

Tools: echo {"text"} answers the text; hang {} never answers (the process
goes on serving other calls); crash {} ends the process mid-call (exit 3),
its request unanswered."""
import json
import os
import sys
import threading

TOOLS = [
    {"name": "echo", "description": "Answers the text.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "hang", "description": "Never answers.", "inputSchema": {"type": "object"}},
    {"name": "crash", "description": "Ends the server mid-call.", "inputSchema": {"type": "object"}},
]
write_lock = threading.Lock()


def send(message):
    with write_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def answer(request, result):
    send({"jsonrpc": "2.0", "id": request["id"], "result": result})


def call(request):
    params = request.get("params") or {}
    name, arguments = params.get("name"), params.get("arguments") or {}
    if name == "echo":
        answer(request, {"content": [{"type": "text", "text": str(arguments.get("text", ""))}], "isError": False})
    elif name == "hang":
        return  # the request stays unanswered; other requests are still read and served
    elif name == "crash":
        os._exit(3)
    else:
        send({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32602, "message": f"unknown tool {name}"}})


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        method = request.get("method")
        if "id" not in request:
            continue  # notifications (initialized, cancelled)
        if method == "initialize":
            answer(request, {"protocolVersion": request["params"].get("protocolVersion", "2025-06-18"),
                             "capabilities": {"tools": {}}, "serverInfo": {"name": "faulty", "version": "1"}})
        elif method == "tools/list":
            answer(request, {"tools": TOOLS})
        elif method == "tools/call":
            call(request)
        elif method == "ping":
            answer(request, {})
        else:
            send({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
