"""The C example client (protobuf-c, built by `make c-client`) against the real server."""
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_c_example_client(server):
    binary = os.environ.get("THREADWIRE_C_EXAMPLE", str(ROOT / ".build" / "threadwire-c-example"))
    out = subprocess.run([binary, server[0], str(server[1])], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "server threadwire 0.1.0"
    assert lines[1] == "health SERVING"
    assert lines[2].startswith("thread ") and lines[2].endswith("runtime 0 mode proactive")
