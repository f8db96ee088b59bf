"""Faults on real test hosts (network namespaces) while clients work through
every instance; the history checker judges each run (issue 27).

Each scenario runs the workload (workload.py, on the client host) for
CHAOS_SECONDS (default 8) under one fault or several, heals everything,
lets the clients make their final reads, and checks the whole history.
`make chaos` runs more rounds (CHAOS_ROUNDS) for longer."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import checker
import cluster
import netns
import second_checker

REASON = netns.unavailable_reason()
# CI runs as root with iproute2 and nftables: there nothing is skipped and a
# missing piece fails the runs (the lab fixture); elsewhere they are skipped.
pytestmark = pytest.mark.skipif(REASON is not None and not os.environ.get("CI"), reason=f"fault tests skipped: {REASON}")

SECONDS = float(os.environ.get("CHAOS_SECONDS", "8"))
ROUNDS = int(os.environ.get("CHAOS_ROUNDS", "1"))
WORKLOAD = Path(__file__).with_name("workload.py")
VERDICTS = os.environ.get("CHAOS_VERDICTS")


@pytest.fixture(scope="module")
def lab():
    if REASON is not None:
        pytest.fail(f"the fault tests must run under CI: {REASON}")
    net = netns.Network(["pg", "i1", "i2", "i3", "cl"])
    try:
        postgres = cluster.Postgres(net)
        try:
            yield net, postgres
        finally:
            postgres.close()
    finally:
        net.close()


def sleep_until(moment):
    time.sleep(max(0.0, moment - time.monotonic()))


def run(lab, name, faults, tmp_path, skews=None, setup_instance=0, seed=1, token=None, tablespace=None):
    """Runs the workload under `faults(net, cluster, started)`, heals, checks.
    Returns (verdict, what `faults` returned, the history)."""
    net, postgres = lab
    nodes = cluster.Cluster(net, postgres, skews, token, tablespace=tablespace)
    history, setup, healed = tmp_path / f"{name}.history", tmp_path / f"{name}.setup", tmp_path / f"{name}.healed"
    failed = True
    try:
        workload = subprocess.Popen(net.exec_args("cl") + [
            sys.executable, str(WORKLOAD), "--instances", ",".join(nodes.addresses), "--history", str(history),
            "--setup", str(setup), "--duration", str(SECONDS), "--healed", str(healed), "--seed", str(seed),
            "--setup-instance", str(setup_instance)] + (["--token", token] if token else []))
        while not setup.exists():
            assert workload.poll() is None, "the workload ended before its setup"
            time.sleep(0.02)
        started = time.monotonic()
        observed = faults(net, nodes, started)
        sleep_until(started + SECONDS)
        net.heal()
        for instance in nodes.instances:
            if not instance.running:
                instance.start()
        healed.write_text("healed")
        assert workload.wait(timeout=SECONDS + 180) == 0, "the workload failed"
        state = json.loads(setup.read_text())
        operations = checker.load(history)
        verdict = checker.check(operations, caps={state["spawn_root"]: (3, state["children"])}, initial=state["initial"])
        second, second_anomalies = second_checker.verdict(history, setup, 3)
        state_of = "VALID" if verdict.valid else ("INVALID" if verdict.anomalies else "UNKNOWN")
        line = f"{name}: {verdict.summary()}; gocheck: {second}"
        print("\n" + line + "".join(f"\n  {anomaly}" for anomaly in verdict.anomalies[:20] + verdict.unknown))
        if VERDICTS:
            with open(VERDICTS, "a") as out:
                out.write(line + "\n")
        assert second == state_of, f"the two checkers disagree: gocheck {second} {second_anomalies[:5]}"
        assert verdict.valid
        assert verdict.acknowledged > 50, "too little was acknowledged to judge anything"
        # Not vacuous: something was heard. (How much depends on the fault:
        # 10 % packet loss once left 17 notices in a run of 137 operations.)
        assert verdict.notices > 0, "the subscribers heard nothing: what they hear went unjudged"
        assert state["stuck_turns"] == [], f"turns still running {state['turns_settled_after']} s after the heal"
        failed = False
        return verdict, observed, operations
    finally:
        if "workload" in locals() and workload.poll() is None:
            workload.kill()
        nodes.close()
        if failed:
            for host, log in nodes.logs().items():
                print(f"--- {host} log (last lines) ---\n" + "\n".join(log.splitlines()[-25:]))


def errors(operations_file_lines):
    return [json.loads(line).get("error") or "" for line in operations_file_lines]


@pytest.mark.parametrize("round", range(ROUNDS))
def test_owner_cut_from_postgres_steps_down_and_another_takes_over(lab, tmp_path, round):
    observed = {}

    def faults(net, nodes, started):
        # i1 made (and owns) every thread.
        sleep_until(started + 1)
        net.cut("i1", "pg")
        cut_at = time.monotonic()
        # Past its validity (3/4 of the lease) it has stepped down and is not ready.
        sleep_until(cut_at + cluster.LEASE_SECONDS * 1.5)
        observed["readiness"] = nodes.readiness("i1")
        sleep_until(cut_at + 5)
        net.heal("i1", "pg")
        return observed

    run(lab, f"owner cut from PostgreSQL #{round}", faults, tmp_path, seed=round + 1)
    status, body = observed["readiness"]
    assert status == 503, f"the cut-off owner still says it is ready: {status} {body}"
    history = Path(tmp_path, f"owner cut from PostgreSQL #{round}.history").read_text().splitlines()
    causes = [e for e in errors(history) if "lease" in e or "store" in e]
    print(f"  i1 readiness during the cut: {status} {body}; {len(causes)} operation(s) refused naming the store or a lease")


@pytest.mark.parametrize("round", range(ROUNDS))
def test_instance_cut_from_its_peers(lab, tmp_path, round):
    def faults(net, nodes, started):
        sleep_until(started + 1)
        net.cut("i2", "i1")
        net.cut("i2", "i3")
        sleep_until(started + 5)
        net.heal()

    run(lab, f"instance cut from its peers #{round}", faults, tmp_path, setup_instance=1, seed=round + 11)


@pytest.mark.parametrize("round", range(ROUNDS))
def test_clients_cut_from_an_instance_mid_request(lab, tmp_path, round):
    """First the answers are lost (requests still arrive and are carried
    out, so every client retries changes that were made), then the whole link."""
    def faults(net, nodes, started):
        sleep_until(started + 1)
        net.cut_one_way("i2", "cl")
        sleep_until(started + 4)
        net.cut("cl", "i2")
        sleep_until(started + 6)
        net.heal()

    run(lab, f"clients cut from an instance #{round}", faults, tmp_path, setup_instance=1, seed=round + 21)


@pytest.mark.parametrize("round", range(ROUNDS))
def test_packet_loss(lab, tmp_path, round):
    """Loss is injected with nftables, which every kernel here has."""
    def faults(net, nodes, started):
        for host in ("i1", "i2", "pg"):
            net.loss(host, 10)

    run(lab, f"packet loss #{round}", faults, tmp_path, seed=round + 31)


@pytest.mark.parametrize("round", range(ROUNDS))
def test_packet_loss_and_delay(lab, tmp_path, round):
    """Delay needs tc netem, a kernel module some machines lack: there the
    test is reported as skipped, with the kernel's answer."""
    missing = netns.netem_support()
    if missing is not None:
        pytest.skip(f"packet delay: {missing}")

    def faults(net, nodes, started):
        for host in ("i1", "i2", "pg"):
            net.loss(host, 10)
        net.delay("i3", 20)

    run(lab, f"packet loss and delay #{round}", faults, tmp_path, seed=round + 31)


@pytest.mark.parametrize("round", range(ROUNDS))
def test_kill9_of_instances_during_load(lab, tmp_path, round):
    def faults(net, nodes, started):
        sleep_until(started + 1.5)
        nodes.instances[0].kill9()   # the owner of everything
        sleep_until(started + 4)
        nodes.instances[0].start()
        nodes.instances[1].kill9()
        sleep_until(started + 6.5)
        nodes.instances[1].start()

    run(lab, f"kill -9 during load #{round}", faults, tmp_path, seed=round + 41)


@pytest.mark.parametrize("round", range(ROUNDS))
def test_clock_skewed_owner_cut_off_no_second_owner(lab, tmp_path, round):
    """i3 runs five minutes ahead and i2 five minutes behind (Debian's
    libfaketime, wall clock only): lease expiry is the database's and
    validity the monotonic clock's, so when the skewed owner is cut off and
    another takes over, the two never serve a tree at once (each instance's
    own view, from its /leases, sampled in turn throughout)."""
    samples = []
    beliefs = []

    def faults(net, nodes, started):
        sampler = cluster.LeaseSampler(nodes, str(tmp_path / "leases.jsonl"))
        try:
            sleep_until(started + 1)
            net.cut("i3", "pg")
            cut_at = time.monotonic()
            while time.monotonic() < cut_at + 5:
                samples.append(nodes.leases())
                time.sleep(0.2)
            net.heal()
            sleep_until(started + 7)
        finally:
            beliefs.extend(sampler.stop())

    name = f"clock skew (+5 min, -5 min) #{round}"
    run(lab, name, faults, tmp_path, skews={"i3": "+5m", "i2": "-5m"}, setup_instance=2, seed=round + 51)
    held_by = {host for host, leases in beliefs if leases and leases.get("held")}
    print(f"  /leases sampled {len(beliefs)} times; instances seen holding trees: {sorted(held_by)}")
    assert len(held_by) >= 2, "the samples never saw the trees move from one instance to another"
    assert cluster.serving_overlaps(beliefs) == []
    setup = json.loads(Path(tmp_path, f"{name}.setup").read_text())
    ahead = min(setup["created_at_ms"]) - setup["wall_clock_ms"]
    assert ahead > 4 * 60 * 1000, f"the threads i3 made are dated {ahead} ms from now: its clock is not skewed"
    holders = {}
    for rows in samples:
        for tree, instance, address, epoch, live in rows:
            holders.setdefault((tree, epoch), set()).add(instance)
    moved = {tree for (tree, epoch) in holders if epoch != "1"}
    assert moved, "the skewed owner's trees never moved to another instance"


def test_wall_clocks_at_other_rates_and_jumping(lab, tmp_path):
    """i2's wall clock runs at half speed and i3's at twice; i1's jumps five
    minutes ahead mid-run, then five minutes back behind the true time.
    Leases are the database's and validity the monotonic clock's, so no wall
    clock may matter; i1 made the threads, so it owns them through its jumps."""
    clock = tmp_path / "i1-clock"
    clock.write_text("+0\n")

    def faults(net, nodes, started):
        sleep_until(started + 2)
        clock.write_text("+5m\n")
        sleep_until(started + 5)
        clock.write_text("-5m\n")

    name = "wall clocks at 0.5x and 2x, one jumping +5 min then -5 min"
    run(lab, name, faults, tmp_path, skews={"i1": f"file:{clock}", "i2": "+0 x0.5", "i3": "+0 x2"}, seed=91)
    setup = json.loads(Path(tmp_path, f"{name}.setup").read_text())
    assert abs(min(setup["created_at_ms"]) - setup["wall_clock_ms"]) < 60_000, "i1 made the threads before its clock jumped"
    # The jumps happened: i1 dated turns it ran from both stretches.
    offsets = [started - setup["wall_clock_ms"] for started in setup["turns_started_ms"]]
    assert any(offset > 4 * 60_000 for offset in offsets), "no turn was dated 5 minutes ahead: the clock did not jump"
    assert any(offset < -4 * 60_000 for offset in offsets), "no turn was dated 5 minutes behind: the clock did not jump back"


def test_authenticated_cluster_with_a_peer_secret(lab, tmp_path):
    """Clients authenticate with a token, instances relay to each other with
    the shared --peer-token; under a cut owner and a kill -9, relayed calls
    still act as the client's principal (threads are the principal's: a
    relay that lost it would answer NOT_FOUND, a definite failure)."""
    refused_hellos = {}

    def faults(net, nodes, started):
        sleep_until(started + 1)
        net.cut("i1", "pg")
        sleep_until(started + 3.5)
        net.heal()
        nodes.instances[1].kill9()
        sleep_until(started + 5)
        nodes.instances[1].start()
        sleep_until(started + SECONDS - 0.5)
        # A refused peer hello is retried elsewhere by the client (UNAVAILABLE
        # from the relaying instance), so it shows only in the owner's counts.
        for instance in nodes.instances:
            refused_hellos[instance.host] = sum(
                float(line.rsplit(" ", 1)[1]) for line in nodes.metrics(instance.host).splitlines()
                if line.startswith("threadwire_requests_total{") and 'method="initialize"' in line and 'code="UNAUTHENTICATED"' in line)

    name = "authenticated, with a peer secret"
    run(lab, name, faults, tmp_path, seed=101, token="chaos-client-token-0123456789abcdef")
    ended = Path(tmp_path, f"{name}.history").read_text().splitlines()
    codes = {}
    for error in errors(ended):
        if error:
            codes[error.split(":", 1)[0]] = codes.get(error.split(":", 1)[0], 0) + 1
    print(f"  errors by status code: {codes}")
    # NOT_FOUND, PERMISSION_DENIED or UNAUTHENTICATED: a relay that lost the
    # client's principal (or a peer refused) — the checker counts a refusal
    # as "not done", so it would not see one.
    assert not {"5", "7", "16"} & set(codes), codes
    assert refused_hellos and not any(refused_hellos.values()), f"initialize refused UNAUTHENTICATED: {refused_hellos}"


def test_postgres_disk_full(lab, tmp_path):
    """The database's tablespace (a small tmpfs) fills up mid-run: inserts
    fail with "No space left on device" while PostgreSQL stays up; then
    room is made again.

    Of about fifty runs before, one history came out INVALID (both checkers
    agreed; its anomalies were not kept), and the test ran in `make chaos`
    only. The slowed-fsync fault then found a cause that fits (a stepped-down
    instance served a thread's old snapshot while the unload waited behind a
    command stuck on its commit; fixed in the engine); after the fix, 20 runs
    in a row were VALID, and it gates CI again.
    Its first finding, turns left IN_PROGRESS after the heal, is fixed and
    guarded in `make test` (LimitsTests, a turn whose end cannot be
    committed). In a fresh-clone CI run (run 57, 2026-11-26) it came out
    INVALID again: four acknowledged turns in no read; the owner's lease
    renewal timed out, then its log went silent for 24 s while the other
    instances' relays to it went unanswered. The cause found: the lease loop
    ran the sweep for orphaned turns inline, and a sweep held up by the
    troubled store (an unbounded query, a wait for a thread's command)
    stopped renewals and the step-down alike; the sweep now runs beside the
    loop (LeaseStepDownTests guards it). The turns were most likely stored:
    the final reads of those threads failed and the workload went on, so no
    read held them; final reads now must succeed within 30 s of the heal or
    the run fails saying so."""
    net, postgres = lab
    tablespace, disk = postgres.small_disk()
    filler = Path(disk, "filler")

    def faults(net, nodes, started):
        sleep_until(started + 2)
        with open(filler, "wb") as out:  # every byte the tmpfs has left
            try:
                while True:
                    out.write(b"\0" * (1 << 20))
                    out.flush()
            except OSError:
                pass
        full = time.monotonic()
        sleep_until(started + 5)
        filler.unlink()
        return full, time.monotonic()

    _, (full, room), operations = run(lab, "PostgreSQL out of disk", faults, tmp_path, seed=111, tablespace=tablespace)
    refused = [op for op in operations if op.f in ("write", "append", "enqueue") and op.outcome != "ok" and full <= op.invoked < room]
    print(f"  PostgreSQL out of disk {room - full:.1f} s: {len(refused)} changes not acknowledged meanwhile, "
          f"writes back after {writes_back_after(operations, full, room):.1f} s")
    assert refused, "nothing failed while the disk was full: the fault did not reach the store"


HOLDER = """
import sys, time
from threadwire_client import Client
host, port = sys.argv[1].rsplit(":", 1)
client = Client(host, int(port), timeout=5)
client.initialize(name="half-open")
client.call("thread/start", {"name": "watched"})  # subscribes this connection
print("subscribed", flush=True)
time.sleep(120)
"""


def test_half_open_subscriber_is_reclaimed(lab, tmp_path):
    """A subscribed client's host vanishes: every packet between them is
    dropped (no FIN, no RST). The idle timeout spares a subscriber, so only
    TCP keepalive (--tcp-keepalive-ms 2000: probes after 2 s, three missed
    probes a second apart) can find it; the server must close it."""
    net, postgres = lab
    nodes = cluster.Cluster(net, postgres, extra=["--tcp-keepalive-ms", "2000"])
    holder = None
    try:
        holder = subprocess.Popen(net.exec_args("cl") + [sys.executable, "-c", HOLDER, nodes.instances[0].address],
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "subscribed"
        open_before = nodes.gauge("i1", "threadwire_connections_open", asked_from="i2")
        assert open_before >= 1
        net.cut("cl", "i1")
        cut_at = time.monotonic()
        while nodes.gauge("i1", "threadwire_connections_open", asked_from="i2") >= open_before:
            assert time.monotonic() < cut_at + 30, "the half-open connection was still open 30 s after its client vanished"
            time.sleep(0.25)
        print(f"\n  half-open subscriber reclaimed {time.monotonic() - cut_at:.1f} s after its client vanished")
    finally:
        net.heal()
        if holder:
            holder.kill()
            holder.wait()
        nodes.close()


def writes_back_after(operations, down, up):
    """Seconds from `down` to the first change acknowledged that was sent
    after `up` (the fault healed); fails when none came."""
    back = [op.completed for op in operations if op.f in ("write", "append", "enqueue") and op.outcome == "ok" and op.invoked >= up]
    assert back, "no change was acknowledged after the fault healed"
    return min(back) - down


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_restarted_during_load(lab, tmp_path, mode):
    """PostgreSQL stopped (fast: clients told; immediate: every process gone
    at once, crash recovery) and started again while clients work."""
    def faults(net, nodes, started):
        sleep_until(started + 2)
        return nodes.postgres.restart(mode)

    _, (down, up), operations = run(lab, f"PostgreSQL restarted ({mode})", faults, tmp_path, seed=71)
    print(f"  PostgreSQL restarted ({mode}): down {up - down:.1f} s, writes back after {writes_back_after(operations, down, up):.1f} s")


def test_postgres_paused_beyond_the_lease(lab, tmp_path):
    """Every PostgreSQL process SIGSTOPped for 2.5 leases: connections hang
    unanswered (no reset), commits time out, leases run out; then SIGCONT."""
    def faults(net, nodes, started):
        sleep_until(started + 1.5)
        return nodes.postgres.pause(cluster.LEASE_SECONDS * 2.5)

    _, (paused, resumed), operations = run(lab, "PostgreSQL paused (SIGSTOP)", faults, tmp_path, seed=81)
    print(f"  PostgreSQL paused {resumed - paused:.1f} s: writes back after {writes_back_after(operations, paused, resumed):.1f} s")


def test_postgres_fsync_slowed(lab, tmp_path):
    """PostgreSQL durable (fsync on), then every fsync and fdatasync delayed
    (slow_fsync.c): 200 ms for 3 s (commits wait for a slow WAL flush), then
    1.5 s for 3 s (beyond half the lease: renewals come late), then normal."""
    net, postgres = lab
    postgres.durable(True)
    windows = []

    def faults(net, nodes, started):
        sleep_until(started + 1)
        for milliseconds in (200, 1500):
            begun = time.monotonic()
            postgres.slow_fsync(milliseconds)
            sleep_until(begun + 3)
            windows.append((milliseconds, begun, time.monotonic()))
        delayed = postgres.slow_fsync(0)
        return delayed, time.monotonic()

    try:
        _, (delayed, normal), operations = run(lab, "PostgreSQL fsync slowed", faults, tmp_path, seed=91)
    finally:
        postgres.slow_fsync(0)
        postgres.durable(False)
    assert delayed > 0, "no fsync was delayed: the fault did not reach PostgreSQL"
    for milliseconds, begun, ended in windows:
        acknowledged = sorted(op.completed - op.invoked for op in operations
                              if op.f in ("write", "append", "enqueue") and op.outcome == "ok" and begun <= op.invoked < ended)
        middle = f"{acknowledged[len(acknowledged) // 2] * 1000:.0f} ms" if acknowledged else "none"
        print(f"  fsync slowed by {milliseconds} ms for {ended - begun:.1f} s: {len(acknowledged)} changes acknowledged, "
              f"median {middle}")
    print(f"  {delayed} flushes delayed in all; writes back after {writes_back_after(operations, windows[0][1], normal):.1f} s")


@pytest.mark.parametrize("round", range(ROUNDS))
def test_faults_combined(lab, tmp_path, round):
    def faults(net, nodes, started):
        sleep_until(started + 1)
        net.cut("i1", "pg")
        sleep_until(started + 2)
        net.loss("i2", 10)
        sleep_until(started + 3)
        nodes.instances[1].kill9()
        sleep_until(started + 4)
        net.cut_one_way("i3", "cl")
        sleep_until(started + 5)
        net.heal("i1", "pg")
        sleep_until(started + 6)
        nodes.instances[1].start()

    run(lab, f"combined (partition, loss, kill -9, client cut, skew) #{round}", faults, tmp_path,
        skews={"i3": "+5m"}, seed=round + 61)
