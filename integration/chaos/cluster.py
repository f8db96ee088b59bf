"""PostgreSQL and three threadwire instances, each on its own test host (see
netns.py), for the fault tests."""
import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINARY = os.environ.get("THREADWIRE_SERVER_BIN", str(ROOT / ".build" / "debug" / "threadwire-server"))
PORT, ADMIN_PORT, PG_PORT, PEER_PORT = 7420, 7421, 5432, 7422
# The admin endpoints listen on the test network: they need a token.
ADMIN_TOKEN = "chaos-admin-token-0123456789abcdef"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
LEASE_SECONDS = 2


def postgres_bin():
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if not versions:
        raise RuntimeError("PostgreSQL is not installed (make test installs Debian's postgresql package)")
    return versions[-1]


def skewed_clock_preload(directory):
    """LD_PRELOAD for a process whose wall clock is skewed: libfaketime's
    multithreaded library (preloaded into the server itself: the faketime
    command forks, and kill -9 must reach the server), after a shim that
    keeps it off the monotonic clocks' timers (timerfd_passthrough.c)."""
    found = glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")
    if not found:
        raise RuntimeError("libfaketime is not installed (make test installs Debian's faketime)")
    shim = os.path.join(directory, "timerfd_passthrough.so")
    if not os.path.exists(shim):
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", shim, str(Path(__file__).with_name("timerfd_passthrough.c")), "-ldl"],
                       check=True, capture_output=True)
    return f"{shim} {found[0]}"


class Postgres:
    """A throwaway PostgreSQL on the network's "pg" host."""

    def __init__(self, net):
        self.net = net
        self.host = net.hosts["pg"]
        self.bin = postgres_bin()
        self.dir = tempfile.mkdtemp(prefix="threadwire-chaos-pg-")
        shutil.chown(self.dir, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
        subprocess.run(as_postgres + [f"{self.bin}/initdb", "-D", f"{self.dir}/data", "-U", "threadwire", "--auth=trust", "--no-sync"],
                       check=True, capture_output=True)
        with open(f"{self.dir}/data/pg_hba.conf", "a") as hba:
            hba.write(f"host all all {self.host.rsplit('.', 1)[0]}.0/24 trust\n")
        # In the file, not on the command line, so ALTER SYSTEM can turn it on.
        with open(f"{self.dir}/data/postgresql.conf", "a") as conf:
            conf.write("fsync = off\n")
        self._mount_small_disk()
        self.fsync_control, self.fsync_count = f"{self.dir}/slow-fsync", f"{self.dir}/slowed-fsyncs"
        self.preload = f"{self.dir}/slow_fsync.so"
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", self.preload, str(Path(__file__).with_name("slow_fsync.c")), "-ldl"],
                       check=True, capture_output=True)
        self.start()
        self.databases = 0

    def start(self):
        subprocess.run(self.net.exec_args("pg") + ["runuser", "-u", "postgres", "--", "env", f"LD_PRELOAD={self.preload}",
            f"SLOW_FSYNC_CONTROL={self.fsync_control}", f"SLOW_FSYNC_COUNT={self.fsync_count}",
            f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-l", f"{self.dir}/server.log", "-w", "-t", "60",
            "-o", f"-h {self.host} -p {PG_PORT} -k {self.dir} -c max_connections=300", "start"],
            check=True, capture_output=True)

    def durable(self, on):
        """fsync on (each commit waits for its WAL flush) or off, at once."""
        self.sql(f"ALTER SYSTEM SET fsync = {'on' if on else 'off'}")
        self.sql("SELECT pg_reload_conf()")

    def slow_fsync(self, milliseconds):
        """Every fsync and fdatasync of PostgreSQL waits this long first
        (slow_fsync.c); 0 ends it. Returns how many calls were delayed so far."""
        Path(self.fsync_control).write_text(str(milliseconds))
        return Path(self.fsync_count).stat().st_size if os.path.exists(self.fsync_count) else 0

    def restart(self, mode):
        """pg_ctl stop -m MODE ("fast": clients disconnected, a checkpoint;
        "immediate": every process quits at once, crash recovery on start),
        then start. (stopping began, accepting again), monotonic seconds."""
        stopping = time.monotonic()
        subprocess.run(["runuser", "-u", "postgres", "--", f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-m", mode,
                        "-w", "stop"], check=True, capture_output=True)
        self.start()
        return stopping, time.monotonic()

    def pause(self, seconds):
        """SIGSTOP to the postmaster and every backend (connections stay open
        and unanswered, as with a hung host), SIGCONT after `seconds`.
        (paused at, resumed at), monotonic seconds."""
        postmaster = int(Path(self.dir, "data", "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
        pids = [postmaster] + [int(pid) for pid in children]
        paused = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            # Backends forked meanwhile cannot exist (the postmaster was stopped).
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        return paused, time.monotonic()

    def sql(self, statement, database="postgres"):
        result = subprocess.run(self.net.exec_args("pg") + [
            f"{self.bin}/psql", "-h", self.host, "-p", str(PG_PORT), "-U", "threadwire", "-d", database, "-Atc", statement],
            capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"psql: {result.stderr.strip()}")
        return result.stdout

    def database(self, tablespace=None):
        """A new empty database (in `tablespace`, if given); its URL."""
        self.databases += 1
        name = f"chaos{self.databases}"
        self.sql(f"CREATE DATABASE {name}" + (f" TABLESPACE {tablespace}" if tablespace else ""))
        return f"postgres://threadwire@{self.host}:{PG_PORT}/{name}"

    SMALL_DISK_MB = 48

    def _mount_small_disk(self):
        """A tmpfs of SMALL_DISK_MB, mounted before the server starts: `ip
        netns exec` gives the server a copy of the mounts made before it, so
        one made later would not be its (the filler, written from here, takes
        the same tmpfs's room)."""
        self.small = f"{self.dir}/small"
        os.mkdir(self.small)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.SMALL_DISK_MB}m", "tmpfs", self.small],
                       check=True, capture_output=True)
        os.mkdir(f"{self.small}/space")
        shutil.chown(f"{self.small}/space", "postgres")

    def small_disk(self):
        """A tablespace on the small tmpfs: (its name, the tmpfs's directory).
        Tables and indexes written there fail with "No space left on device"
        once it is full; PostgreSQL itself (its WAL elsewhere) stays up."""
        if not getattr(self, "small_tablespace", None):
            self.sql(f"CREATE TABLESPACE small LOCATION '{self.small}/space'")
            self.small_tablespace = "small"
        return self.small_tablespace, self.small

    def close(self):
        subprocess.run(["runuser", "-u", "postgres", "--", f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-m", "immediate", "-w", "stop"],
                       capture_output=True)
        # The stopped server's files may still be closing: a plain umount can
        # find the tmpfs busy, and every run then left one mounted.
        if subprocess.run(["umount", f"{self.dir}/small"], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", f"{self.dir}/small"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


class Instance:
    def __init__(self, net, host, store, directory, skew=None, authentication=None, extra=()):
        self.net, self.host, self.store, self.skew, self.extra = net, host, store, skew, list(extra)
        # ["--auth-tokens", FILE, "--peer-token", SECRET], or none at all.
        self.authentication = authentication or ["--allow-unauthenticated"]
        self.address = f"{net.hosts[host]}:{PORT}"
        # With a peer secret the instances relay on a listener of their own
        # (--peer-listen), advertised instead of the clients' one.
        self.peer_address = f"{net.hosts[host]}:{PEER_PORT}" if "--peer-token" in self.authentication else None
        self.directory = directory
        self.log = open(os.path.join(directory, f"{host}.log"), "ab")
        self.config = os.path.join(directory, "config.json")
        self.proc = None

    def start(self):
        env = dict(os.environ)
        if self.skew:
            # Only the wall clock: a machine's monotonic clock is its own.
            env.update({"LD_PRELOAD": skewed_clock_preload(self.directory), "FAKETIME_DONT_RESET": "1",
                        "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
            if self.skew.startswith("file:"):
                # A clock that can jump mid-run: libfaketime reads its offset
                # from the file, again at most every second.
                env.update({"FAKETIME_TIMESTAMP_FILE": self.skew[len("file:"):], "FAKETIME_CACHE_DURATION": "1"})
            else:
                env["FAKETIME"] = self.skew
        env["THREADWIRE_ADMIN_TOKEN"] = ADMIN_TOKEN
        self.proc = subprocess.Popen(self.net.exec_args(self.host) + [
            BINARY, "--listen", self.address, "--advertise", self.peer_address or self.address, "--store", self.store,
            *(["--peer-listen", self.peer_address] if self.peer_address else []),
            "--lease-seconds", str(LEASE_SECONDS), "--admin-listen", f"{self.net.hosts[self.host]}:{ADMIN_PORT}",
            "--config", self.config, "--log-level", os.environ.get("CHAOS_LOG_LEVEL", "notice"), *self.authentication, *self.extra],
            stdout=subprocess.PIPE, stderr=self.log, env=env)
        deadline = time.monotonic() + 60
        lines = []
        while len(lines) < 2 and time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode()
            if not line:
                raise RuntimeError(f"{self.host} exited while starting ({self.proc.wait()}); see its log")
            lines.append(line)
        if not any(line.startswith("threadwire listening on ") for line in lines):
            raise RuntimeError(f"{self.host}: {lines}")

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None


class Cluster:
    """Three instances on one database of `postgres`, on hosts i1..i3."""

    def __init__(self, net, postgres, skews=None, token=None, extra=(), tablespace=None):
        """`token`: clients authenticate with it (principal "chaos"), and the
        instances relay to each other with a shared peer secret."""
        self.net = net
        self.postgres = postgres
        self.url = postgres.database(tablespace)
        self.dir = tempfile.mkdtemp(prefix="threadwire-chaos-")
        Path(self.dir, "config.json").write_text(json.dumps({"agents": {"max_threads": 3}}))
        authentication = None
        if token:
            tokens = Path(self.dir, "tokens")
            tokens.write_text(f"chaos {token}\n")
            tokens.chmod(0o600)
            authentication = ["--auth-tokens", str(tokens), "--peer-token", "chaos-peer-secret-0123456789abcdef"]
        skews = skews or {}
        self.instances = [Instance(net, f"i{n}", self.url, self.dir, skews.get(f"i{n}"), authentication, extra) for n in (1, 2, 3)]
        try:
            for instance in self.instances:
                instance.start()
        except Exception:
            self.close()
            raise

    @property
    def addresses(self):
        return [instance.address for instance in self.instances]

    def metrics(self, host, asked_from="cl"):
        """An instance's /metrics text, asked from the client host (or another)."""
        script = ("import urllib.request\n"
                  f"print(urllib.request.urlopen(urllib.request.Request('http://{self.net.hosts[host]}:{ADMIN_PORT}/metrics', "
                  f"headers={ADMIN_HEADERS!r}), timeout=5).read().decode())")
        return subprocess.run(self.net.exec_args(asked_from) + ["python3", "-c", script], capture_output=True, text=True,
                              timeout=20, check=True).stdout

    def gauge(self, host, name, asked_from="cl"):
        """One unlabelled gauge of an instance's /metrics."""
        for line in self.metrics(host, asked_from).splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{host} has no {name} in /metrics")

    def readiness(self, host):
        """(HTTP status, body) of an instance's /readyz, asked from the client host."""
        script = ("import urllib.request, urllib.error, sys\n"
                  f"try:\n r = urllib.request.urlopen(urllib.request.Request('http://{self.net.hosts[host]}:{ADMIN_PORT}/readyz', "
                  f"headers={ADMIN_HEADERS!r}), timeout=3)\n"
                  " print(r.status); print(r.read().decode())\n"
                  "except urllib.error.HTTPError as e:\n print(e.code); print(e.read().decode())\n")
        result = subprocess.run(self.net.exec_args("cl") + ["python3", "-c", script], capture_output=True, text=True, timeout=20)
        status, _, body = result.stdout.partition("\n")
        return int(status or 0), body.strip()

    def leases(self):
        """[(tree, instance id, address, epoch, live)] as the database sees them now."""
        rows = self.postgres.sql("SELECT tree, instance_id, address, epoch, expires_at > now() FROM thread_leases ORDER BY tree",
                                 database=self.url.rsplit("/", 1)[1])
        return [tuple(line.split("|")) for line in rows.splitlines() if line]

    def close(self):
        for instance in self.instances:
            instance.stop()
            instance.log.close()

    def logs(self):
        return {i.host: Path(self.dir, f"{i.host}.log").read_text(errors="replace") for i in self.instances}


LEASE_SAMPLER = """
import json, os, sys, time, urllib.request
hosts, out, stop = sys.argv[1].split(","), open(sys.argv[2], "w", buffering=1), sys.argv[3]
headers = json.loads(sys.argv[4])
while not os.path.exists(stop):
    for host in hosts:
        try:
            leases = json.loads(urllib.request.urlopen(urllib.request.Request(f"http://{host}/leases", headers=headers), timeout=1).read())
        except Exception as error:
            leases = None
        out.write(json.dumps({"host": host, "leases": leases}) + "\\n")
"""


class LeaseSampler:
    """Asks each instance in turn, one request at a time from the client
    host, which trees it believes it holds (admin /leases): what each
    instance serves, not what the database says. Requests never overlap,
    so the samples' order is the order in which the instances answered."""

    def __init__(self, cluster, path):
        self.path, self.stop_file = path, f"{path}.stop"
        hosts = ",".join(f"{cluster.net.hosts[i.host]}:{ADMIN_PORT}" for i in cluster.instances)
        self.names = {f"{cluster.net.hosts[i.host]}:{ADMIN_PORT}": i.host for i in cluster.instances}
        self.proc = subprocess.Popen(cluster.net.exec_args("cl") + ["python3", "-c", LEASE_SAMPLER, hosts, path, self.stop_file,
                                                                     json.dumps(ADMIN_HEADERS)])

    def stop(self):
        Path(self.stop_file).touch()
        self.proc.wait(timeout=30)
        samples = [json.loads(line) for line in Path(self.path).read_text().splitlines() if line.strip()]
        return [(self.names[s["host"]], s["leases"]) for s in samples]


def serving_overlaps(samples):
    """Times two instances served one tree at once. An instance's two
    consecutive answers that both hold tree T at epoch E, surely valid,
    bracket a stretch in which it served T throughout (an epoch only grows,
    and a lease taken over cannot be renewed at the old epoch); another
    instance answering in between that it serves T is a second owner."""
    overlaps = []
    by_host = {}
    for index, (host, leases) in enumerate(samples):
        by_host.setdefault(host, []).append(index)

    def held(index):
        leases = samples[index][1]
        if not leases or not leases.get("surely_valid"):
            return set()
        return {(lease["tree"], lease["epoch"]) for lease in leases.get("held", [])}

    for host, indexes in by_host.items():
        for first, second in zip(indexes, indexes[1:]):
            steady = held(first) & held(second)
            if not steady:
                continue
            for between in range(first + 1, second):
                other, _ = samples[between]
                if other == host:
                    continue
                for tree, epoch in steady:
                    for other_tree, other_epoch in held(between):
                        if other_tree == tree:
                            overlaps.append(f"{tree}: {host} served it at epoch {epoch} before and after {other} "
                                            f"served it at epoch {other_epoch}")
    return overlaps
