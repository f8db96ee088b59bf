"""The real server for each test; message code comes from the threadwire_client
package, which generates it from proto/ with grpcio-tools when it is built."""
import os
import pathlib
import subprocess

import pytest

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
