"""The second, independent history checker (gocheck/main.go, in Go from the
published algorithms): built once per test session, run on each history;
the fault runs and test_checker.py require it to agree with checker.py."""
import json
import math
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).with_name("gocheck") / "main.go"
BINARY = ROOT / ".build" / "gocheck"


def binary():
    if not BINARY.exists() or BINARY.stat().st_mtime < SOURCE.stat().st_mtime:
        BINARY.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GOPROXY="off", GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
        subprocess.run(["go", "build", "-o", str(BINARY), SOURCE.name], cwd=SOURCE.parent, env=env, check=True,
                       capture_output=True)
    return BINARY


def verdict(history, setup, cap):
    """("VALID" | "INVALID" | "UNKNOWN", [anomalies]) for a history file and
    the workload's setup file."""
    result = subprocess.run([str(binary()), str(history), str(setup), str(cap)], capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"gocheck failed: {result.stderr.strip()}")
    lines = result.stdout.splitlines()
    return lines[0], lines[1:]


def write(operations, history, setup, initial=None, spawn_root="", children=()):
    """checker.Operation objects as a history file and a setup file, as the
    workload writes them."""
    with open(history, "w") as out:
        for number, op in enumerate(operations, 1):
            written = op.value if op.f in ("write", "append", "enqueue", "notice") else None
            out.write(json.dumps({"type": "invoke", "id": number, "process": op.process, "f": op.f, "key": op.key,
                                  "value": written, "time": op.invoked}) + "\n")
            ended = op.completed if not math.isinf(op.completed) else op.invoked + 1e9
            read = op.value if op.f not in ("write", "append", "enqueue", "notice") and op.outcome == "ok" else None
            out.write(json.dumps({"type": op.outcome, "id": number, "value": read, "time": ended}) + "\n")
    Path(setup).write_text(json.dumps({"initial": initial or {}, "spawn_root": spawn_root, "children": list(children)}))
