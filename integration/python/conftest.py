"""The real server for each test; message code comes from the threadwire_client
package, which generates it from proto/ with grpcio-tools when it is built."""
import os
import pathlib
import subprocess

import pytest

LISTENERS = {"threadwire listening on ": "frames", "threadwire grpc on ": "grpc", "threadwire web on ": "web"}


def start_listening(tmp_path, *arguments, listen="127.0.0.1:0"):
    """The server with the listeners its arguments ask for (--grpc-listen,
    --web-listen): its process and each listener's address by name. The
    store is tmp_path/store: a second start on it is a restart."""
    binary = os.environ.get("THREADWIRE_SERVER_BIN", str(ROOT / ".build" / "debug" / "threadwire-server"))
    proc = subprocess.Popen(
        [binary, "--listen", listen, "--data-dir", str(tmp_path / "store"), "--log-level", "error", *arguments],
        stdout=subprocess.PIPE, text=True)
    wanted = 1 + ("--grpc-listen" in arguments) + ("--web-listen" in arguments)
    addresses = {}
    while len(addresses) < wanted:
        line = proc.stdout.readline().strip()
        assert line, f"the server exited before listening (exit {proc.poll()})"
        for prefix, name in LISTENERS.items():
            if line.startswith(prefix):
                addresses[name] = line.rsplit(" ", 1)[1]
    return proc, addresses


def tokens_file(tmp_path, text, name="tokens"):
    """A --auth-tokens file holding `text` (lines of 'principal token [operator]'), private as the server requires."""
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o600)
    return path


def stop_server(proc):
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=20)


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture()
def server(tmp_path):
    binary = os.environ.get("THREADWIRE_SERVER_BIN", str(ROOT / ".build" / "debug" / "threadwire-server"))
    config = tmp_path / "config.json"
    config.write_text('{"features": {"multi_agent_v2": true, "multi_agent_mode": true}}')
    proc = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "store"), "--config", str(config), "--log-level", "error"],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("threadwire listening on "), line
    host, port = line.rsplit(" ", 1)[1].rsplit(":", 1)
    yield host, int(port)
    proc.terminate()
    proc.wait(timeout=10)
