"""Authentication, TLS and mutual TLS from the Python client and the C example
client, against the real server with certificates made by openssl."""
import os
import pathlib
import socket
import ssl
import subprocess

import pytest

from threadwire_client import Client, StatusError, tls_context

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALICE = "alice-7f3c9a1e5b2d4c6f8a0e"
BOB = "bob-2c4e6a8b0d1f3a5c7e9b"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(ROOT / "integration" / "make_test_certs.sh"), str(directory)], check=True)
    return directory


def start_server(tmp_path, *arguments):
    binary = os.environ.get("THREADWIRE_SERVER_BIN", str(ROOT / ".build" / "debug" / "threadwire-server"))
    proc = subprocess.Popen(
        [binary, "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "store"), "--log-level", "error", *arguments],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("threadwire listening on "), line
    return proc, int(line.rsplit(":", 1)[1])


@pytest.fixture()
def tls_server(tmp_path, certs):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    proc, port = start_server(
        tmp_path, "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
        "--tls-client-ca", str(certs / "ca.pem"), "--auth-tokens", str(tokens))
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def client_tls(certs, name=None):
    if name is None:
        return tls_context(ca_file=str(certs / "ca.pem"))
    return tls_context(ca_file=str(certs / "ca.pem"), cert_file=str(certs / f"{name}.pem"), key_file=str(certs / f"{name}.key"))


def test_mutual_tls_names_the_principal_and_isolates(tls_server, certs):
    with Client(port=tls_server, tls=client_tls(certs, "alice")) as alice:
        assert alice.initialize().principal == "alice"
        thread = alice.call("thread/start", {"name": "from python"}).thread.id
        assert alice.call("thread/read", {"thread_id": thread}).thread.name == "from python"
    with Client(port=tls_server, tls=client_tls(certs, "bob")) as bob:
        assert bob.initialize().principal == "bob"
        with pytest.raises(StatusError) as error:
            bob.call("thread/read", {"thread_id": thread})
        assert error.value.code == 5
        assert "not found" in error.value.message


def test_a_token_over_tls_must_match_the_certificate(tls_server, certs):
    with Client(port=tls_server, tls=client_tls(certs, "alice")) as client:
        assert client.initialize(auth_token=ALICE).principal == "alice"
    with Client(port=tls_server, tls=client_tls(certs, "alice")) as client:
        with pytest.raises(StatusError) as error:
            client.initialize(auth_token=BOB)
        assert error.value.code == 16


def test_no_client_certificate_or_a_wrong_ca_is_refused(tls_server, certs):
    # The server's own TLS alert, not any failure to connect (a dead server
    # would raise ConnectionRefusedError, an OSError too).
    for context, alert in ((client_tls(certs), "TLSV13_ALERT_CERTIFICATE_REQUIRED"),
                           (client_tls(certs, "mallory"), "TLSV1_ALERT_UNKNOWN_CA")):
        with pytest.raises(ssl.SSLError) as refused:
            with Client(port=tls_server, tls=context) as client:
                client.initialize()
        assert refused.value.reason == alert, refused.value
    with Client(port=tls_server, tls=client_tls(certs, "alice")) as alice:
        assert alice.initialize().principal == "alice"
    untrusting = tls_context(ca_file=str(certs / "rogue-ca.pem"), cert_file=str(certs / "alice.pem"), key_file=str(certs / "alice.key"))
    with pytest.raises(ssl.SSLCertVerificationError):
        Client(port=tls_server, tls=untrusting)


def test_tokens_without_tls(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\n")
    proc, port = start_server(tmp_path, "--auth-tokens", str(tokens))
    try:
        with Client(port=port) as client:
            assert client.initialize(auth_token=ALICE).principal == "alice"
        with Client(port=port) as client:
            with pytest.raises(StatusError) as error:
                client.initialize(auth_token="not-a-valid-token-at-all")
            assert error.value.code == 16
            # Then the server closes the connection.
            with pytest.raises((ConnectionError, socket.timeout, OSError)):
                client.call("health/check")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_c_example_client_over_mutual_tls(tls_server, certs):
    binary = os.environ.get("THREADWIRE_C_EXAMPLE", str(ROOT / ".build" / "threadwire-c-example"))
    env = dict(os.environ, THREADWIRE_TLS_CA=str(certs / "ca.pem"),
               THREADWIRE_TLS_CERT=str(certs / "bob.pem"), THREADWIRE_TLS_KEY=str(certs / "bob.key"))
    out = subprocess.run([binary, "127.0.0.1", str(tls_server)], capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == "health SERVING"
    env["THREADWIRE_TLS_CERT"], env["THREADWIRE_TLS_KEY"] = str(certs / "mallory.pem"), str(certs / "mallory.key")
    refused = subprocess.run([binary, "127.0.0.1", str(tls_server)], capture_output=True, text=True, timeout=30, env=env)
    assert refused.returncode != 0


def test_c_example_client_with_a_token(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\n")
    proc, port = start_server(tmp_path, "--auth-tokens", str(tokens))
    binary = os.environ.get("THREADWIRE_C_EXAMPLE", str(ROOT / ".build" / "threadwire-c-example"))
    try:
        good = subprocess.run([binary, "127.0.0.1", str(port)], capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, THREADWIRE_AUTH_TOKEN=ALICE))
        assert good.returncode == 0, good.stderr
        bad = subprocess.run([binary, "127.0.0.1", str(port)], capture_output=True, text=True, timeout=30,
                             env=dict(os.environ, THREADWIRE_AUTH_TOKEN="wrong-token-0123456789"))
        assert bad.returncode != 0
        assert "status 16" in bad.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)
