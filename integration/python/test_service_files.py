"""Service files. contrib/systemd/threadwire.service passes `systemd-analyze verify` with
the installed binary and man page, and the server speaks its Type=notify
protocol: READY=1 once it serves, STOPPING=1 when SIGTERM starts the drain.
contrib/kubernetes/threadwire.yaml's config checks and its probes answer."""
import os
import socket
import subprocess

from conftest import ROOT, stop_server
from test_environment import start, addresses
from threadwire_client import Client

UNIT = ROOT / "contrib" / "systemd" / "threadwire.service"


def verify(tmp_path, text):
    unit = tmp_path / "threadwire.service"
    unit.write_text(text)
    env = {**os.environ, "MANPATH": str(tmp_path / "usr" / "share" / "man")}
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, env=env)


def test_the_unit_file_verifies(tmp_path):
    subprocess.run(["make", "-s", "install-files", f"DESTDIR={tmp_path}", "PREFIX=/usr", "BIN_DIR=.build/debug"],
                   cwd=ROOT, check=True, capture_output=True)
    text = UNIT.read_text().replace("/usr/local/bin/threadwire-server", str(tmp_path / "usr" / "bin" / "threadwire-server"))
    checked = verify(tmp_path, text)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    assert "Type=notify" in text and "ExecReload=/bin/kill -HUP $MAINPID" in text
    # The check is not blind: a misspelt setting is reported.
    assert "Failed to parse service type" in verify(tmp_path, text.replace("Type=notify", "Type=notfy")).stderr


def test_sd_notify_ready_then_stopping(tmp_path):
    path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    listener.settimeout(20)
    proc = start({"NOTIFY_SOCKET": path, "THREADWIRE_DATA_DIR": str(tmp_path / "store"), "THREADWIRE_LOG_LEVEL": "error"},
                 "--listen", "127.0.0.1:0")
    try:
        host, port = addresses(proc, 1)["frames"].rsplit(":", 1)
        ready = listener.recv(4096).decode()
        assert ready.startswith("READY=1\n") and f"MAINPID={proc.pid}" in ready, ready
        with Client(host, int(port)) as client:
            client.initialize("after ready")
        proc.terminate()
        stopping = listener.recv(4096).decode()
        assert stopping.startswith("STOPPING=1"), stopping
        assert proc.wait(timeout=20) == 0
    finally:
        stop_server(proc)
        listener.close()


def test_the_kubernetes_example_config_checks_and_its_grpc_probes_answer(tmp_path):
    """The ConfigMap's config file passes `config check`, and a server started
    from it (addresses and paths moved into the test's sandbox) answers the
    probes the StatefulSet declares: grpc.health.v1 Check on the gRPC port,
    with client authentication on."""
    import json

    import grpc
    import yaml
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    documents = list(yaml.safe_load_all((ROOT / "contrib" / "kubernetes" / "threadwire.yaml").read_text()))
    kinds = {document["kind"]: document for document in documents}
    assert set(kinds) == {"ConfigMap", "StatefulSet", "Service"}
    config = json.loads(kinds["ConfigMap"]["data"]["threadwire.json"])
    container = kinds["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    grpc_port = int(config["server"]["grpc_listen"].rsplit(":", 1)[1])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == grpc_port, probe
    assert {port["containerPort"] for port in container["ports"]} == {
        int(config["server"][key].rsplit(":", 1)[1]) for key in ("listen", "admin_listen", "grpc_listen")}
    printed = tmp_path / "threadwire.json"
    printed.write_text(json.dumps(config))
    checked = subprocess.run([os.environ.get("THREADWIRE_SERVER_BIN", str(ROOT / ".build" / "debug" / "threadwire-server")),
                              "config", "check", str(printed)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr

    tokens = tmp_path / "tokens"
    tokens.write_text("alice alice-0123456789abcdef0123\n")
    tokens.chmod(0o600)
    config["server"].update({"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0",
                             "data_dir": str(tmp_path / "data"), "auth_tokens": str(tokens), "log_level": "error"})
    printed.write_text(json.dumps(config))
    proc = start({"THREADWIRE_ADMIN_TOKEN": "admin-0123456789abcdef"}, *container["args"][:1], str(printed))
    try:
        found = addresses(proc, 2)
        with grpc.insecure_channel(found["grpc"]) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    finally:
        stop_server(proc)
