"""Several instances on one PostgreSQL: the latency one relay hop adds
(thread/settings/update and thread/read, sequential, on the owner vs through
another instance) and the failover time after kill -9 of an owner (until a
request through another instance is served again). Usage:
  cluster.py SERVER_BIN POSTGRES_URL [LEASE_SECONDS]
"""
import os, signal, statistics, subprocess, sys, time
from threadwire_client import Client

binary, url = sys.argv[1], sys.argv[2]
lease = sys.argv[3] if len(sys.argv) > 3 else "10"
ports = [7701, 7702]

def start(port):
    proc = subprocess.Popen([binary, "--listen", f"127.0.0.1:{port}", "--store", url, "--lease-seconds", lease,
                             "--log-level", "error"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("threadwire listening"), line
    return proc

def client(port):
    c = Client("127.0.0.1", port); c.initialize(); return c

def pct(samples, p):
    s = sorted(samples); return s[min(len(s) - 1, int(len(s) * p))] * 1e6

procs = [start(p) for p in ports]
try:
    owner, other = client(ports[0]), client(ports[1])
    thread = owner.call("thread/start", {}).thread.id
    for label, c in (("on the owner", owner), ("relayed (one hop)", other)):
        for method, params in (("thread/settings/update", lambda i: {"thread_id": thread, "model": f"m{i}"}),
                               ("thread/read", lambda i: {"thread_id": thread})):
            for i in range(200): c.call(method, params(i))
            samples = []
            for i in range(3000):
                t = time.perf_counter(); c.call(method, params(i)); samples.append(time.perf_counter() - t)
            print(f"{method:24} {label:18} p50 {pct(samples, .5):7.0f} us  p99 {pct(samples, .99):7.0f} us")
    failovers = []
    for trial in range(3):
        owner_proc = procs[0]
        owner = client(ports[0])
        thread = owner.call("thread/start", {}).thread.id
        other = client(ports[1])
        other.call("thread/read", {"thread_id": thread})
        owner_proc.send_signal(signal.SIGKILL); owner_proc.wait()
        killed = time.perf_counter()
        other.call("thread/settings/update", {"thread_id": thread, "model": "after"})  # waits for the lease inside
        failovers.append(time.perf_counter() - killed)
        procs[0] = start(ports[0])  # a restart at the same address reclaims its leases at once
    print(f"failover after kill -9 (lease {lease} s, no restart before the request): "
          + ", ".join(f"{f:.2f} s" for f in failovers) + f"; p50 {statistics.median(failovers):.2f} s, max {max(failovers):.2f} s")
finally:
    for p in procs:
        p.kill()
