"""The CLI's output formats and exit codes against golden files: each case
runs the real `threadwire` binary against the real server and compares its
exit code, stdout and stderr with integration/python/golden/cli/NAME.txt,
ids, times and ports masked. THREADWIRE_UPDATE_GOLDEN=1 rewrites the files
(review the diff: it is the CLI's user interface)."""
import os
import re
import subprocess

import pytest

from conftest import ROOT, start_listening, stop_server

GOLDEN = ROOT / "integration" / "python" / "golden" / "cli"
CLI = os.environ.get("THREADWIRE_CLI_BIN", str(ROOT / ".build" / "debug" / "threadwire"))
MASKS = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<id>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"), "<time>......"),
    (re.compile(r"\b1\d{12}\b"), "<ms>"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:<port>"),
    (re.compile(r"pytest-of-[^/]+/pytest-\d+/[^/\s]+"), "<tmp>"),
]


def mask(text):
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    proc, addresses = start_listening(tmp, "--config", str(ROOT / "contrib" / "config" / "threadwire.json"))
    yield addresses["frames"], tmp
    stop_server(proc)


def cli(address, *arguments, stdin=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADWIRE_")}
    env["THREADWIRE_SERVER"] = address
    return subprocess.run([CLI, *arguments], capture_output=True, text=True, input=stdin, timeout=60, env=env)


def check(name, done):
    actual = f"exit: {done.returncode}\n--- stdout\n{mask(done.stdout)}--- stderr\n{mask(done.stderr)}"
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("THREADWIRE_UPDATE_GOLDEN") == "1":
        path.write_text(actual)
    assert path.exists(), f"no golden file {path}: run with THREADWIRE_UPDATE_GOLDEN=1 and review it"
    assert actual == path.read_text(), f"{name}: the output differs from {path}"


def test_results_in_every_format(served):
    address, tmp = served
    thread = cli(address, "thread", "start", "--mode", "proactive", "-o", "id").stdout.strip()
    assert re.fullmatch(r"[0-9a-f-]{36}", thread), "-o id prints only the id"
    for output in ("json", "yaml", "table", "wide", "id"):
        check(f"thread-start.{output}", cli(address, "thread", "start", "--mode", "proactive", "-o", output))
    check("turn-start.table", cli(address, "turn", "start", thread, "summarise the repo", "-o", "table"))
    check("turn-start.yaml", cli(address, "turn", "start", thread, "and now the tests", "-o", "yaml"))
    check("turn-start.json", cli(address, "turn", "start", thread, "one more"))
    check("thread-read.wide", cli(address, "thread", "read", thread, "--turns", "-o", "wide"))
    check("thread-items.table", cli(address, "thread", "items", thread, "--limit", "3", "-o", "table"))
    check("mode-show", cli(address, "mode", "show", thread))
    check("mode-show.json", cli(address, "mode", "show", thread, "-o", "json"))
    check("mode-show.yaml", cli(address, "mode", "show", thread, "-o", "yaml"))
    check("mode-set.table", cli(address, "mode", "set", thread, "explicitRequestOnly", "-o", "table"))
    check("health.table", cli(address, "health", "-o", "table"))
    check("health.yaml", cli(address, "health", "-o", "yaml"))
    check("health.json", cli(address, "health"))
    params = tmp / "params.json"
    params.write_text(f'{{"thread_id": "{thread}"}}')
    check("call-data-file.yaml", cli(address, "call", "thread/name/set", "-d", f'{{"thread_id": "{thread}", "name": "golden"}}', "-o", "yaml"))
    check("call-data-file.table", cli(address, "call", "thread/read", "-d", f"@{params}", "-o", "table"))
    check("call-data-stdin.id", cli(address, "call", "thread/read", "-d", "@-", "-o", "id", stdin=params.read_text()))


def test_list_and_describe_from_the_servers_schema(served):
    address, _ = served
    check("list", cli(address, "list"))
    check("list.wide", cli(address, "list", "--all", "-o", "wide"))
    check("describe-method", cli(address, "describe", "thread/settings/update"))
    check("describe-message", cli(address, "describe", "ThreadSettings"))
    check("describe-enum", cli(address, "describe", "threadwire.v1.MultiAgentMode"))
    check("describe-unknown", cli(address, "describe", "thread/nope"))


def test_errors_and_exit_codes(served):
    address, tmp = served
    for output in ("json", "yaml", "table"):
        check(f"not-found.{output}", cli(address, "thread", "read", "no-such-thread", "-o", output))
    check("usage-missing-argument", cli(address, "thread", "read"))
    check("usage-bad-format", cli(address, "thread", "list", "-o", "xml"))
    broken = tmp / "broken.json"
    broken.write_text('{\n  "thread_id": "x",\n  "include_turns": tru\n}\n')
    check("usage-bad-json", cli(address, "call", "thread/read", "-d", f"@{broken}"))
    check("usage-unreadable-data", cli(address, "call", "thread/read", "-d", "@/nonexistent/params.json"))
    check("invalid-argument", cli(address, "turn", "start", cli(address, "thread", "start", "-o", "id").stdout.strip(), "x",
                                  "--effort", "enormous", "--no-wait"))
    check("unreachable", cli("127.0.0.1:1", "health"))
    check("no-running-turn", cli(address, "turn", "interrupt", cli(address, "thread", "start", "-o", "id").stdout.strip()))
