"""The README's CLI session, replayed command by command from a fresh store:
the server is started as `make run` starts it (the command `make -n run`
prints), each `$ threadwire …` line runs in bash with the variables the
session set, and its output must be what the README shows, ids, times and
ports masked. A README that drifts from the product fails here."""
import os
import re
import shlex
import subprocess

from conftest import LISTENERS, ROOT, stop_server
from test_cli_output import mask

README = ROOT / "README.md"
BIN = ROOT / ".build" / "debug"


def session():
    """(command, expected output lines) pairs of the README's first console block after '## A session with the CLI'."""
    text = README.read_text()
    block = text.split("## A session with the CLI", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    steps = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def make_run(tmp_path, command):
    """The server command `make run` runs, with every listener on port 0 and the store in tmp_path."""
    variables = ["LISTEN=127.0.0.1:0", "ADMIN_LISTEN=127.0.0.1:0", "GRPC_LISTEN=127.0.0.1:0", "WEB_LISTEN=127.0.0.1:0",
                 f"DATA_DIR={tmp_path / 'data'}"]
    variables += [word for word in shlex.split(command.split("&")[0])[2:] if "=" in word]
    dry = subprocess.run(["make", "-s", "-n", "run", *variables], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    line = next(line for line in dry.replace("\\\n", " ").splitlines() if "threadwire-server" in line and line.startswith("swift run"))
    arguments = shlex.split(line.split("threadwire-server", 1)[1])
    proc = subprocess.Popen([str(BIN / "threadwire-server"), *arguments, "--log-level", "error"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    shown, address = [], None
    while len(shown) < 4:
        out = proc.stdout.readline()
        assert out, f"the server exited (exit {proc.poll()})"
        shown.append(out.rstrip("\n"))
        if out.startswith(next(iter(LISTENERS))):
            address = out.split()[-1]
    return proc, address, shown


def test_the_readme_session_reproduces(tmp_path):
    steps = session()
    assert len(steps) >= 10, "the README's session is where this test expects it"
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADWIRE_")}
    env["PATH"] = f"{BIN}:{env['PATH']}"
    variables = {}
    proc = None
    try:
        for command, expected in steps:
            bare = command.split("  #")[0].strip()
            if bare.startswith("make run") or " make run" in bare:
                if proc is not None and bare.startswith("kill"):
                    stop_server(proc)
                proc, address, actual = make_run(tmp_path, bare[bare.index("make run"):])
                env["THREADWIRE_SERVER"] = address
            elif bare.startswith("export PATH="):
                actual = []
            else:
                assignment = re.match(r"^([A-Z])=\$\((.*)\)$", bare)
                script = assignment.group(2) if assignment else bare
                done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT,
                                      env={**env, **variables})
                assert done.returncode == 0, f"$ {command}\nexit {done.returncode}: {done.stderr}"
                if assignment:
                    variables[assignment.group(1)] = done.stdout.strip()
                actual = [] if assignment else done.stdout.splitlines()
            want = [line.split("  #")[0].rstrip() if not line.startswith("{") else line for line in expected]
            got = [line.rstrip() for line in actual]
            if os.environ.get("THREADWIRE_SHOW_SESSION") == "1":
                # Writing the README: print what each command shows instead of comparing.
                print(f"$ {command}\n" + "\n".join(got))
                continue
            if bare.startswith("make run") or " make run" in bare:
                # The listeners come up in any order.
                got, want = sorted(got), sorted(want)
            assert [mask(line) for line in got] == [mask(line) for line in want], f"$ {command}"
    finally:
        if proc is not None:
            stop_server(proc)
