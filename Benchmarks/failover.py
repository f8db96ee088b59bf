"""Issue 27: how long a partitioned owner's threads wait before another
instance serves them, against the lease time.

On the fault tests' test hosts (integration/chaos: network namespaces, as root):
PostgreSQL and three instances with --lease-seconds LEASE. Each trial makes
a thread through i1 (its owner), cuts i1 from PostgreSQL, and from then on a
client on the client host sends a keyed thread/settings/update for that
thread through i2 every 50 ms (each attempt with a 1 s timeout) until one
succeeds; the time from the cut to that success is the trial's. Then the
cut heals and i1 is ready again before the next trial.

Usage (make bench-idempotency): python Benchmarks/failover.py [TRIALS] [LEASE ...]
"""
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "chaos"))
import cluster  # noqa: E402
import netns  # noqa: E402

CLIENT = r'''
import sys, time, uuid
from threadwire_client import Client
owner, other, out = sys.argv[1], sys.argv[2], sys.argv[3]
def connect(address, timeout):
    host, port = address.rsplit(":", 1)
    client = Client(host, int(port), timeout=timeout)
    client.initialize()
    return client
thread = connect(owner, 5).call("thread/start", {}).thread.id
connect(owner, 5).call("thread/settings/update", {"thread_id": thread, "model": "before"})
open(out, "w").write("ready\n")
while open(out).read().count("\n") < 2:   # the orchestrator appends "cut"
    time.sleep(0.005)
cut = time.monotonic()
key = str(uuid.uuid4())
while True:
    try:
        client = connect(other, 1)
        response = client.wait(client.send("thread/settings/update", {"thread_id": thread, "model": "after"}, idempotency_key=key))
        if response.code == 0:
            break
    except OSError:
        pass
    time.sleep(0.05)
open(out, "a").write(f"{time.monotonic() - cut}\n")
'''


def trial(net, nodes, workdir, n):
    out = Path(workdir, f"trial-{n}")
    client = subprocess.Popen(net.exec_args("cl") + [sys.executable, "-c", CLIENT, nodes.addresses[0], nodes.addresses[1], str(out)])
    while not out.exists() or "ready" not in out.read_text():
        time.sleep(0.01)
    net.cut("i1", "pg")
    with open(out, "a") as handle:
        handle.write("cut\n")
    client.wait(timeout=120)
    elapsed = float(out.read_text().splitlines()[-1])
    net.heal()
    deadline = time.monotonic() + 30
    while nodes.readiness("i1")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    return elapsed


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    leases = [float(x) for x in sys.argv[2:]] or [2.0, 5.0]
    reason = netns.unavailable_reason()
    if reason:
        print(f"failover benchmark skipped: {reason}")
        return
    net = netns.Network(["pg", "i1", "i2", "i3", "cl"])
    results = {}
    try:
        postgres = cluster.Postgres(net)
        try:
            for lease in leases:
                cluster.LEASE_SECONDS = lease
                nodes = cluster.Cluster(net, postgres)
                try:
                    results[lease] = [trial(net, nodes, nodes.dir, n) for n in range(trials)]
                finally:
                    nodes.close()
        finally:
            postgres.close()
    finally:
        net.close()
    print(f"\nA partitioned owner's thread served again by another instance ({trials} trials each):")
    print("lease s | p50 s | max s | p50 / lease")
    for lease, times in results.items():
        p50 = statistics.median(times)
        print(f"{lease:7.1f} | {p50:5.2f} | {max(times):5.2f} | {p50 / lease:.2f}")
    print(json.dumps({str(k): v for k, v in results.items()}))


if __name__ == "__main__":
    main()
