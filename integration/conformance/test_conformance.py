"""One scenario, five languages and three transports: the Swift CLI, Python,
C, Go and TypeScript clients run the same session against one server at the
same time over TCP frames, and Python also over a WebSocket and a gRPC
Connect stream; each transcript must equal expected.txt line for line (see
README.md here)."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture()
def server(tmp_path):
    binary = os.environ.get("THREADWIRE_SERVER_BIN", str(ROOT / ".build" / "debug" / "threadwire-server"))
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--web-listen", "127.0.0.1:0",
                             "--data-dir", str(tmp_path / "store"), "--log-level", "error"],
                            stdout=subprocess.PIPE, text=True)
    addresses = {}
    while len(addresses) < 3:
        line = proc.stdout.readline().strip()
        assert line, f"the server exited (exit {proc.poll()})"
        kind = {"threadwire listening on ": "frames", "threadwire grpc on ": "grpc", "threadwire web on ": "web"}
        for prefix, name in kind.items():
            if line.startswith(prefix):
                addresses[name] = line.rsplit(" ", 1)[1]
    yield addresses
    proc.terminate()
    proc.wait(timeout=10)


def commands(addresses):
    address = addresses["frames"]
    host, port = address.rsplit(":", 1)
    python = os.environ.get("THREADWIRE_PYTHON", str(ROOT / ".build" / "venv" / "bin" / "python"))
    go_env = {**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    return {
        "swift": ([str(ROOT / ".build" / "debug" / "threadwire"), "conformance", "--server", address], None, None),
        "python": ([python, str(HERE / "scenario.py"), address], None, None),
        # The same session over the other two transports.
        "python over WebSocket": ([python, str(HERE / "scenario.py"), addresses["web"].replace("http://", "ws://") + "/ws"], None, None),
        "python over gRPC Connect": ([python, str(HERE / "scenario.py"), "grpc://" + addresses["grpc"]], None, None),
        "c": ([str(ROOT / ".build" / "threadwire-c-conformance"), host, port], None, None),
        "go": (["go", "run", "./examples/conformance", address], ROOT / "clients" / "go", go_env),
        "typescript": (["node", str(ROOT / "clients" / "typescript" / "examples" / "conformance.mjs"), address], None, None),
    }


def test_every_language_prints_the_same_transcript(server):
    expected = (HERE / "expected.txt").read_text().splitlines()
    running = {name: subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, (command, cwd, env) in commands(server).items()}
    failures = []
    for name, proc in running.items():
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            failures.append(f"{name}: exit {proc.returncode}\n{err}")
            continue
        lines = out.splitlines()
        for number, (want, got) in enumerate(zip(expected, lines), 1):
            if want != got:
                failures.append(f"{name}, line {number}:\n  expected {want}\n  got      {got}")
        if len(lines) != len(expected):
            failures.append(f"{name}: {len(lines)} lines, expected {len(expected)}\n{out}")
    assert not failures, "\n".join(failures)
