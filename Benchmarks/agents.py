"""Issue 23 measurements: what a call from the server to a client costs,
an MCP call through threadwire against the same call made directly, and the
memory a turn waiting on a client holds.

Usage: agents.py SERVER_BIN [--rounds N] [--waiting N]
Needs the Python client and mcp-server-time (make py-deps)."""
import argparse
import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from threadwire_client import Client, messages

VENV_BIN = pathlib.Path(sys.executable).parent


def percentiles(samples):
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"p50_ms": round(pick(0.50) * 1000, 3), "p99_ms": round(pick(0.99) * 1000, 3), "n": len(ordered)}


def start_server(binary, directory):
    config = pathlib.Path(directory) / "config.json"
    config.write_text(json.dumps({"mcp_servers": {"time": {
        "command": str(VENV_BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"], "startup_timeout_ms": 60000}}}))
    proc = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--data-dir", str(pathlib.Path(directory) / "store"),
         "--config", str(config), "--log-level", "error"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    host, port = line.rsplit(" ", 1)[1].rsplit(":", 1)
    return proc, host, int(port)


def rss_bytes(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_turn(client, thread_id, text):
    turn_id = client.call("turn/start", {"thread_id": thread_id, "input": [{"text": text}]}).turn.id
    for n in client.iter_notifications():
        if n.WhichOneof("payload") == "turn_completed" and n.turn_completed.turn.id == turn_id:
            return n.turn_completed.turn


def wait_ready(client):
    deadline = time.time() + 120
    while time.time() < deadline:
        servers = client.call("mcp_server/list").servers
        if servers and all(s.state == messages.thread.MCP_SERVER_STATE_READY for s in servers):
            return
        time.sleep(0.1)
    raise SystemExit("mcp-server-time never became ready")


TOOL = {"name": "echo", "description": "Echoes.", "parameters_json_schema": '{"type":"object"}'}


def round_trips(host, port, rounds):
    """Bare request round trips against turns with and without one client tool call."""
    results = {}
    with Client(host, port) as client:
        client.on_tool("echo", lambda args: "ok")
        client.initialize("bench-agents")
        thread_id = client.call("thread/start", {"client_tools": [TOOL]}).thread.id
        for _ in range(50):  # warm up
            client.call("thread/read", {"thread_id": thread_id})
        bare = []
        for _ in range(rounds):
            started = time.perf_counter()
            client.call("thread/read", {"thread_id": thread_id})
            bare.append(time.perf_counter() - started)
        results["thread/read round trip"] = percentiles(bare)
        durable = []
        for i in range(rounds):
            started = time.perf_counter()
            client.call("thread/settings/update", {"thread_id": thread_id, "cwd": f"/w{i % 2}"})
            durable.append(time.perf_counter() - started)
        results["thread/settings/update round trip (durable commit)"] = percentiles(durable)
        plain, tooled = [], []
        for i in range(rounds // 4):
            started = time.perf_counter()
            run_turn(client, thread_id, "hello")
            plain.append(time.perf_counter() - started)
            started = time.perf_counter()
            turn = run_turn(client, thread_id, '#tool echo {"i": %d}' % i)
            tooled.append(time.perf_counter() - started)
            assert turn.items[-2].tool_output == "ok" or any(item.tool_output == "ok" for item in turn.items), turn
        results["turn, no tool (1 model call)"] = percentiles(plain)
        results["turn with one client tool (2 model calls + item/tool/call round trip)"] = percentiles(tooled)
        results["added by the client tool, p50 difference ms"] = round(
            (statistics.median(tooled) - statistics.median(plain)) * 1000, 3)
    return results


def mcp_calls(host, port, rounds):
    """An MCP call through threadwire (turn with the call minus turn without) and direct."""
    results = {}
    with Client(host, port) as client:
        client.initialize("bench-mcp")
        wait_ready(client)
        thread_id = client.call("thread/start", {"mcp_servers": ["time"]}).thread.id
        plain, tooled, item_ms = [], [], []
        for _ in range(rounds // 4):
            started = time.perf_counter()
            run_turn(client, thread_id, "hello")
            plain.append(time.perf_counter() - started)
            started = time.perf_counter()
            turn = run_turn(client, thread_id, '#tool mcp__time__get_current_time {"timezone": "UTC"}')
            tooled.append(time.perf_counter() - started)
            item = [i for i in turn.items if i.type == messages.turn.ITEM_TYPE_TOOL_CALL][0]
            assert item.status == messages.turn.ITEM_STATUS_COMPLETED, item
            item_ms.append(item.duration_ms / 1000)
        results["turn, no tool"] = percentiles(plain)
        results["turn with one MCP call (get_current_time)"] = percentiles(tooled)
        results["added by the MCP call through threadwire, p50 difference ms"] = round(
            (statistics.median(tooled) - statistics.median(plain)) * 1000, 3)
        results["MCP item duration_ms (server-side, ms resolution)"] = percentiles(item_ms)
    results["direct tools/call to mcp-server-time (Python MCP SDK, stdio)"] = asyncio.run(direct_mcp(rounds // 4))
    return results


async def direct_mcp(rounds):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    params = StdioServerParameters(command=str(VENV_BIN / "mcp-server-time"), args=["--local-timezone", "UTC"])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for _ in range(20):
                await session.call_tool("get_current_time", {"timezone": "UTC"})
            samples = []
            for _ in range(rounds):
                started = time.perf_counter()
                await session.call_tool("get_current_time", {"timezone": "UTC"})
                samples.append(time.perf_counter() - started)
            return percentiles(samples)


def waiting_turns(host, port, pid, count):
    """RSS of the server with `count` turns each waiting on a client tool nobody answers."""
    with Client(host, port) as client:
        client.initialize("bench-waiting", client_tools=True)  # declared, never answers
        threads = [client.call("thread/start", {"client_tools": [TOOL]}).thread.id for _ in range(count)]
        for thread_id in threads:
            run_turn(client, thread_id, "warm up")
        time.sleep(1)
        before = rss_bytes(pid)
        for thread_id in threads:
            client.call("turn/start", {"thread_id": thread_id, "input": [{"text": '#tool echo {"wait": true}'}]})
        deadline = time.time() + 60
        while len(client.server_requests) < count and time.time() < deadline:
            client._pump()
        assert len(client.server_requests) == count, f"{len(client.server_requests)} of {count} turns waiting"
        time.sleep(1)
        after = rss_bytes(pid)
        return {"waiting turns": count, "rss_before_mib": round(before / 2**20, 1), "rss_after_mib": round(after / 2**20, 1),
                "bytes_per_waiting_turn": (after - before) // count}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("server_bin")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--waiting", type=int, default=200)
    args = parser.parse_args()
    report = {}
    with tempfile.TemporaryDirectory() as directory:
        proc, host, port = start_server(args.server_bin, directory)
        try:
            report["client tool round trip"] = round_trips(host, port, args.rounds)
            report["MCP"] = mcp_calls(host, port, args.rounds)
            report["memory"] = waiting_turns(host, port, proc.pid, args.waiting)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
