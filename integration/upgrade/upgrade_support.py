"""What the upgrade fixture's writer and its test share: a server process on
a given store, a throwaway PostgreSQL, and the cold reads compared."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from threadwire_client import Client

ROOT = Path(__file__).resolve().parents[2]
CONFIG = '{"features": {"multi_agent_v2": true, "multi_agent_mode": true}}'


class Server:
    """threadwire-server on `store_arguments`, stopped gracefully on exit."""

    def __init__(self, store_arguments, work_dir):
        self.binary = os.environ.get("THREADWIRE_SERVER_BIN", str(ROOT / ".build" / "debug" / "threadwire-server"))
        config = Path(work_dir, "config.json")
        config.write_text(CONFIG)
        self.arguments = [self.binary, "--listen", "127.0.0.1:0", "--config", str(config), "--log-level", "error",
                          *store_arguments]

    def __enter__(self):
        self.process = subprocess.Popen(self.arguments, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline().strip()
        if not line.startswith("threadwire listening on "):
            self.process.kill()
            raise RuntimeError(f"the server did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        return self

    def client(self):
        client = Client(port=self.port)
        client.initialize("upgrade")
        return client

    def __exit__(self, *exc):
        self.process.terminate()
        assert self.process.wait(timeout=30) == 0, "the server did not stop cleanly"


def postgres_bin():
    versions = sorted(int(v) for v in os.listdir("/usr/lib/postgresql") if v.isdigit())
    return f"/usr/lib/postgresql/{versions[-1]}/bin"


class Postgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (initdb as `postgres`
    when running as root: initdb refuses root)."""

    def __enter__(self):
        self.bin = postgres_bin()
        self.dir = tempfile.mkdtemp(prefix="threadwire-upgrade-pg-")
        self.as_owner = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            self.as_owner = ["runuser", "-u", "postgres", "--"]
        with socket_port() as port:
            self.port = port
        subprocess.run(self.as_owner + [f"{self.bin}/initdb", "-D", f"{self.dir}/data", "-U", "threadwire",
                                        "--auth=trust", "--no-sync"], check=True, capture_output=True)
        subprocess.run(self.as_owner + [f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-l", f"{self.dir}/log", "-w",
                                        "-t", "60", "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1",
                                        "start"], check=True, capture_output=True)
        return self

    def url(self, database):
        return f"postgres://threadwire@127.0.0.1:{self.port}/{database}"

    def psql(self, database, *arguments, stdin=None):
        return subprocess.run([f"{self.bin}/psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "threadwire",
                               "-d", database, "-v", "ON_ERROR_STOP=1", "-q", *arguments],
                              input=stdin, check=True, capture_output=True, text=True).stdout

    def create(self, database):
        self.psql("postgres", "-c", f"CREATE DATABASE {database}")
        return self.url(database)

    def dump(self, database):
        return subprocess.run([f"{self.bin}/pg_dump", "-h", "127.0.0.1", "-p", str(self.port), "-U", "threadwire",
                               "--no-owner", "--no-privileges", database],
                              check=True, capture_output=True, text=True).stdout

    def restore(self, database, sql):
        url = self.create(database)
        self.psql(database, stdin=sql)
        return url

    def __exit__(self, *exc):
        subprocess.run(self.as_owner + [f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-m", "immediate", "-w",
                                        "stop"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


class socket_port:
    """A port free a moment ago on 127.0.0.1."""

    def __enter__(self):
        import socket
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        return self.socket.getsockname()[1]

    def __exit__(self, *exc):
        self.socket.close()


def snapshot(client, threads):
    """Every thread's cold thread/read (turns included) and both lists, as
    dicts with the .proto field names."""
    reads = {thread: client.call_dict("thread/read", {"thread_id": thread, "include_turns": True, "turns_limit": 1000})
             for thread in threads}
    lists = {
        "active": [t.get("id") for t in client.call_dict("thread/list", {"limit": 100}).get("data", [])],
        "archived": [t.get("id") for t in client.call_dict("thread/list", {"limit": 100, "archived": True}).get("data", [])],
    }
    return {"threads": reads, "lists": lists}
