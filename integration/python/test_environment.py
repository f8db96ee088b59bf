"""The server configured from THREADWIRE_* environment variables alone (no
flag): listeners, store, tokens and config file come from the environment,
a flag given as well wins, and a bad value stops startup naming the variable."""
import os
import subprocess

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
    assert bad.returncode != 0 and "max-connections" in err, err
