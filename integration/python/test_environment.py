"""The server configured from THREADWIRE_* environment variables or config
file keys alone (no flag): listeners, store, tokens and limits come from
them, a flag wins over its variable and a variable over the file, a bad value
stops startup naming where it came from; --print-config, `config check` and
the SIGHUP reload of the log level, on the real binary."""
import json
import os
import queue
import signal
import subprocess
import threading
import time

import grpc
import pytest

from conftest import tokens_file, LISTENERS, ROOT
from threadwire_client import Client
from threadwire_client.client import StatusError

ALICE = "alice-0f2e4d6c8b1a3e5c7d9f"


def start(env, *arguments):
    binary = os.environ.get("THREADWIRE_SERVER_BIN", str(ROOT / ".build" / "debug" / "threadwire-server"))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THREADWIRE_")}
    return subprocess.Popen([binary, *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**clean, **env})


def addresses(proc, wanted):
    found = {}
    while len(found) < wanted:
        line = proc.stdout.readline().strip()
        assert line, f"the server exited (exit {proc.poll()}): {proc.stderr.read()}"
        for prefix, name in LISTENERS.items():
            if line.startswith(prefix):
                found[name] = line.rsplit(" ", 1)[1]
    return found


def stderr_line(proc, *wanted, timeout=60):
    """The server's next line of standard error holding one of `wanted`,
    failing (not hanging) when none comes within `timeout` seconds."""
    if not hasattr(proc, "stderr_lines"):
        proc.stderr_lines = queue.Queue()

        def pump():
            for line in proc.stderr:
                proc.stderr_lines.put(line)
            proc.stderr_lines.put(None)
        threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = proc.stderr_lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"the server said none of {wanted} within {timeout} s") from None
        assert line is not None, f"the server exited (exit {proc.poll()}) before saying any of {wanted}"
        if any(text in line for text in wanted):
            return line


def test_a_server_configured_by_the_environment_alone(tmp_path):
    tokens = tokens_file(tmp_path, f"alice {ALICE}\n")
    config = tmp_path / "config.json"
    config.write_text('{"features": {"multi_agent_v2": true, "multi_agent_mode": true}}')
    proc = start({"THREADWIRE_LISTEN": "127.0.0.1:0", "THREADWIRE_GRPC_LISTEN": "127.0.0.1:0",
                  "THREADWIRE_DATA_DIR": str(tmp_path / "store"), "THREADWIRE_AUTH_TOKENS": str(tokens),
                  "THREADWIRE_CONFIG": str(config), "THREADWIRE_LOG_LEVEL": "error"})
    try:
        found = addresses(proc, 2)
        host, port = found["frames"].rsplit(":", 1)
        with Client(host, int(port)) as client:
            with pytest.raises(StatusError) as refused:
                client.initialize("env", auth_token="not-a-token-0123456789")
            assert refused.value.code == 16, "THREADWIRE_AUTH_TOKENS is in force"
        with Client(host, int(port)) as client:
            client.initialize("env", auth_token=ALICE)
            started = client.call("thread/start", {"multi_agent_mode": "MULTI_AGENT_MODE_PROACTIVE"})
            turn = client.call("turn/start", {"thread_id": started.thread.id, "input": [{"text": "hi"}]}).turn.id
            for note in client.iter_notifications():
                if note.WhichOneof("payload") == "turn_completed" and note.turn_completed.turn.id == turn:
                    assert note.turn_completed.turn.context.multi_agent_runtime == 3, "THREADWIRE_CONFIG's v2 feature is in force"
                    break
        assert (tmp_path / "store").is_dir(), "THREADWIRE_DATA_DIR is where the store went"
        grpc.channel_ready_future(grpc.insecure_channel(found["grpc"])).result(timeout=10)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_flag_wins_over_its_variable_and_a_bad_value_is_refused_naming_it(tmp_path):
    proc = start({"THREADWIRE_LISTEN": "127.0.0.1:1", "THREADWIRE_DATA_DIR": str(tmp_path / "store"), "THREADWIRE_LOG_LEVEL": "error"},
                 "--listen", "127.0.0.1:0")
    try:
        found = addresses(proc, 1)
        assert not found["frames"].endswith(":1"), "the flag's address, not the variable's"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    bad = start({"THREADWIRE_DATA_DIR": str(tmp_path / "other"), "THREADWIRE_ALLOW_UNAUTHENTICATED": "maybe"})
    _, err = bad.communicate(timeout=20)
    assert bad.returncode != 0 and "THREADWIRE_ALLOW_UNAUTHENTICATED must be true or false" in err
    bad = start({"THREADWIRE_DATA_DIR": str(tmp_path / "other"), "THREADWIRE_MAX_CONNECTIONS": "lots"})
    _, err = bad.communicate(timeout=20)
    assert bad.returncode != 0 and "THREADWIRE_MAX_CONNECTIONS must be an integer, got 'lots'" in err, err


def run(*arguments, env=None):
    binary = os.environ.get("THREADWIRE_SERVER_BIN", str(ROOT / ".build" / "debug" / "threadwire-server"))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THREADWIRE_")}
    return subprocess.run([binary, *arguments], capture_output=True, text=True, timeout=30, env={**clean, **(env or {})})


def test_a_server_configured_by_its_config_file_alone(tmp_path):
    """Listeners, store and limits from the file's keys; a variable wins over the file."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"server": {"listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0", "data_dir": str(tmp_path / "store"),
                                             "log_level": "error"},
                                  "limits": {"max_frame_bytes": 65536, "idle_timeout_ms": 12345}}))
    proc = start({"THREADWIRE_CONFIG": str(config), "THREADWIRE_DATA_DIR": str(tmp_path / "from-env"), "THREADWIRE_IDLE_TIMEOUT_MS": "23456"})
    try:
        found = addresses(proc, 2)
        host, port = found["frames"].rsplit(":", 1)
        with Client(host, int(port)) as client:
            hello = client.initialize("file")
            assert hello.limits.max_frame_bytes == 65536, "limits.max_frame_bytes from the file is in force"
            assert hello.limits.idle_timeout_ms == 23456, "THREADWIRE_IDLE_TIMEOUT_MS wins over limits.idle_timeout_ms"
        grpc.channel_ready_future(grpc.insecure_channel(found["grpc"])).result(timeout=10)
        assert (tmp_path / "from-env").is_dir() and not (tmp_path / "store").exists(), "THREADWIRE_DATA_DIR wins over server.data_dir"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_print_config_redacts_secrets_and_reads_back_as_the_same_configuration(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"features": {"multi_agent_v2": True}, "server": {"listen": "127.0.0.1:7777"},
                                  "mcp_servers": {"time": {"command": "mcp-server-time", "env": {"API_KEY": "sk-live-123"}}}}))
    printed = run("--print-config", "--config", str(config), "--peer-token", "peer-secret-0123456789abcdef",
                  "--store", "postgres://tw:db-password-42@db.example/tw", env={"THREADWIRE_MAX_FRAME_BYTES": "65536"})
    assert printed.returncode == 0, printed.stderr
    for secret in ("peer-secret-0123456789abcdef", "db-password-42", "sk-live-123"):
        assert secret not in printed.stdout
    shown = json.loads(printed.stdout)
    assert shown["server"]["listen"] == "127.0.0.1:7777", "the file's key"
    assert shown["server"]["peer_token"] == "<redacted>" and shown["server"]["store"] == "postgres://tw:redacted@db.example/tw"
    assert shown["limits"]["max_frame_bytes"] == 65536, "the variable's value"
    assert shown["limits"]["max_connections"] == 4096, "the default, filled in"
    assert shown["features"] == {"multi_agent": True, "multi_agent_v2": True, "multi_agent_mode": False}
    assert shown["mcp_servers"]["time"]["env"] == {"API_KEY": "<redacted>"}
    again = tmp_path / "printed.json"
    again.write_text(printed.stdout)
    checked = run("config", "check", str(again))
    assert checked.returncode == 0 and checked.stdout.strip() == f"{again}: valid", checked.stderr
    reprinted = run("--print-config", "--config", str(again), "--peer-token", "peer-secret-0123456789abcdef",
                    "--store", "postgres://tw:db-password-42@db.example/tw")
    assert json.loads(reprinted.stdout) == shown, "the printed configuration is the same configuration"


def test_config_check_names_the_key_and_exits_78(tmp_path):
    cases = {
        '{"server": {"log_level": "loud"}}': "server.log_level: The value 'loud' is invalid for '--log-level <log-level>'. "
                                             "Please provide one of the following: trace, debug, info, notice, warning, error, critical",
        '{"server": {"max_connections": 3}}': "unknown key 'server.max_connections'",
        '{"limits": {"max_frame_bytes": "big"}}': "limits.max_frame_bytes must be an integer, got 'big'",
        '{"server": {"listen": "nowhere"}}': "--listen",
        '{\n  "features": {\n    "multi_agent_v2": tru\n  }\n}': "is not JSON: line 3, column 2",
    }
    for text, expected in cases.items():
        path = tmp_path / "bad.json"
        path.write_text(text)
        checked = run("config", "check", str(path))
        assert checked.returncode == 78, (text, checked.stdout, checked.stderr)
        assert expected in checked.stderr, (text, checked.stderr)
    good = tmp_path / "good.json"
    good.write_text('{"server": {"listen": "0.0.0.0:7420"}, "features": {"multi_agent_v2": true}}')
    assert run("config", "check", str(good)).returncode == 0
    # With this environment laid over it, a bad variable fails the check too.
    assert run("config", "check", "--with-environment", str(good), env={"THREADWIRE_EVENT_LOOPS": "x"}).returncode == 78


def test_sighup_applies_the_config_files_log_level_and_says_so(tmp_path):
    config = tmp_path / "config.json"
    settings = {"server": {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "store"), "log_level": "warning"}}
    config.write_text(json.dumps(settings))
    proc = start({}, "--config", str(config))
    try:
        host, port = addresses(proc, 1)["frames"].rsplit(":", 1)
        settings["server"]["log_level"] = "debug"
        config.write_text(json.dumps(settings))
        proc.send_signal(signal.SIGHUP)
        line = stderr_line(proc, "log level")
        assert "log level changed from warning to debug" in line, line
        with Client(host, int(port)) as client:
            client.initialize("after")
        line = stderr_line(proc, "connection opened")
        assert " debug " in line, line
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    # A flag fixes the level: the reload says it stays.
    config.write_text(json.dumps({"server": {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "store"), "log_level": "debug"}}))
    proc = start({}, "--config", str(config), "--log-level", "notice")
    try:
        addresses(proc, 1)
        proc.send_signal(signal.SIGHUP)
        line = stderr_line(proc, "log level")
        assert "log level stays notice" in line, line
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_sighup_applies_the_config_files_per_principal_limits_to_connected_clients(tmp_path):
    config = tmp_path / "config.json"
    settings = {"server": {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "store"), "log_level": "notice"},
                "limits": {"max_requests_per_second": 1000, "request_burst": 1000, "max_running_turns": 5}}
    config.write_text(json.dumps(settings))
    # A variable fixes max_running_turns: the file's new value does not apply.
    proc = start({"THREADWIRE_MAX_RUNNING_TURNS": "7"}, "--config", str(config))
    try:
        host, port = addresses(proc, 1)["frames"].rsplit(":", 1)
        with Client(host, int(port)) as connected:
            hello = connected.initialize("before")
            assert hello.limits.max_requests_per_second == 1000 and hello.limits.max_running_turns == 7
            settings["limits"].update({"max_requests_per_second": 2, "request_burst": 2, "max_running_turns": 1,
                                       "max_connections": 10})
            config.write_text(json.dumps(settings))
            proc.send_signal(signal.SIGHUP)
            line = stderr_line(proc, "per-principal limits", "limits.max_requests_per_second")
            assert "limits.max_requests_per_second: 1000 -> 2" in line and "limits.request_burst: 1000 -> 2" in line, line
            assert "max_running_turns" not in line, "THREADWIRE_MAX_RUNNING_TURNS keeps its value"
            # A connection limit is built into the listener: the reload says it waits for a restart.
            line = stderr_line(proc, "take effect only at a restart")
            assert line.rstrip().endswith("take effect only at a restart: limits.max_connections"), line
            # The connection from before the reload is served, under the new rate.
            codes = []
            for _ in range(10):
                try:
                    connected.call("thread/list", {})
                    codes.append(0)
                except StatusError as refused:
                    codes.append(refused.code)
            assert codes[0] == 0 and 8 in codes, codes
        with Client(host, int(port)) as fresh:
            hello = fresh.initialize("after")
            assert hello.limits.max_requests_per_second == 2 and hello.limits.max_running_turns == 7
    finally:
        proc.terminate()
        proc.wait(timeout=20)
