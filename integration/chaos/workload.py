"""The clients of a fault test (runs on the client host, in its namespace).

Workers change and read a few threads through every instance at once, each
through a ReconnectingClient (a new connection on another instance when one
is lost; changes carry idempotency keys), and record every operation to a
history file for the checker: an invoke line before it is sent, and an ok,
fail or info line when it ends.

    workload.py --instances HOST:PORT,... --history FILE --setup FILE
                --duration SECONDS --healed FILE [--workers N] [--seed N]

Subscribers (--subscribers) hold their own connections, subscribed to every
thread (thread/resume), and record each settings change and turn start they
hear as a "notice" of their connection: the checker judges the order, the
uniqueness and the reality of what each connection heard. A subscriber's
next connection resumes each thread after the last event number it handled,
and a number that skips one (a change it never heard) fails the run.

After --duration the workers stop; once the --healed file exists (every
fault healed, every instance running) the final reads are made and recorded.
"""
import argparse
import json
import os
import random
import socket
import sys
import threading
import traceback
import time
from pathlib import Path

from threadwire_client import Client, ReconnectingClient, RetryPolicy, StatusError, notification_thread_id

# Refusals the server remembers under an idempotency key: the change surely
# was not made. Any other end of an operation leaves it indeterminate.
DEFINITE_REFUSALS = {3, 5, 6, 7, 9, 11, 12}
USER_MESSAGE = 1


class History:
    def __init__(self, path):
        self.file = open(path, "w", buffering=1)
        self.lock = threading.Lock()
        self.next_id = 0

    def invoke(self, process, f, key, value=None):
        with self.lock:
            self.next_id += 1
            self._write({"type": "invoke", "id": self.next_id, "process": process, "f": f, "key": key, "value": value,
                         "time": time.monotonic()})
            return self.next_id

    def notice(self, process, key, value):
        """Something a subscriber heard, when it heard it: an operation that
        ends as it begins."""
        with self.lock:
            self.next_id += 1
            now = time.monotonic()
            self._write({"type": "invoke", "id": self.next_id, "process": process, "f": "notice", "key": key, "value": value,
                         "time": now})
            self._write({"type": "ok", "id": self.next_id, "value": None, "time": now})

    def end(self, op_id, outcome, value=None, error=None):
        with self.lock:
            self._write({"type": outcome, "id": op_id, "value": value, "error": error, "time": time.monotonic()})

    def _write(self, event):
        self.file.write(json.dumps(event) + "\n")


TOKEN = None  # --token: the clients' bearer token


def connector(instances, start):
    """Connects to the instances in turn, from `start`, moving on after each use."""
    position = [start]

    def connect():
        last = None
        for _ in range(len(instances)):
            host, port = instances[position[0] % len(instances)].rsplit(":", 1)
            position[0] += 1
            try:
                client = Client(host, int(port), timeout=2.0)
                client.initialize(name="chaos", auth_token=TOKEN)
                return client
            except OSError as error:
                last = error
        raise last

    return connect


def retrying(instances, start):
    return ReconnectingClient(connector(instances, start),
                              RetryPolicy(max_attempts=8, initial_backoff=0.1, max_backoff=1.0))


def perform(history, client, process, f, key, method, params, value=None, result=None):
    """One recorded operation; `result(response)` is the value an ok read returns."""
    op_id = history.invoke(process, f, key, value)
    try:
        response = client.response(method, params)
    except OSError as error:
        history.end(op_id, "info", error=f"{type(error).__name__}: {error}")
        return None
    if response.code == 0:
        history.end(op_id, "ok", value=result(response) if result else None)
        return response
    outcome = "fail" if response.code in DEFINITE_REFUSALS else "info"
    history.end(op_id, outcome, error=f"{response.code}: {response.message}")
    return None


def turn_inputs(response):
    turns = response.thread_read.thread.turns
    return [next((item.text for item in turn.items if item.type == USER_MESSAGE), "") for turn in turns]


def read_settings(history, client, process, thread):
    """One thread/read: each field as a read of its register, and the pair
    as one snapshot (the checker finds a read torn between writes)."""
    ops = [history.invoke(process, "read", f"{thread}:model"), history.invoke(process, "read", f"{thread}:cwd"),
           history.invoke(process, "snapshot", thread)]
    try:
        response = client.response("thread/read", {"thread_id": thread})
    except OSError as error:
        for op in ops:
            history.end(op, "info", error=str(error))
        return
    if response.code != 0:
        for op in ops:
            history.end(op, "info", error=f"{response.code}: {response.message}")
        return
    thread_message = response.thread_read.thread
    history.end(ops[0], "ok", value=thread_message.model)
    history.end(ops[1], "ok", value=thread_message.cwd)
    history.end(ops[2], "ok", value={"model": thread_message.model, "cwd": thread_message.cwd})
    return response


# How long after the heal a thread may stay unreadable before the run fails.
FINAL_READ_SECONDS = 30


def read_turns(history, client, process, thread):
    return perform(history, client, process, "list", thread, "thread/read",
                   {"thread_id": thread, "include_turns": True, "turns_limit": 1000}, result=turn_inputs)


def worker(index, args, setup, history, deadline):
    rng = random.Random(args.seed * 1000 + index)
    client = retrying(args.instances, index)
    process = f"w{index}"
    n = 0
    while time.monotonic() < deadline:
        n += 1
        thread = rng.choice(setup["threads"])
        roll = rng.random()
        if roll < 0.22:
            value = f"m-{process}-{n}"
            perform(history, client, process, "write", f"{thread}:model", "thread/settings/update",
                    {"thread_id": thread, "model": value}, value=value)
        elif roll < 0.34:
            value = f"/w/{process}/{n}"
            perform(history, client, process, "write", f"{thread}:cwd", "thread/settings/update",
                    {"thread_id": thread, "cwd": value}, value=value)
        elif roll < 0.56:
            read_settings(history, client, process, thread)
        elif roll < 0.71:
            value = f"t-{process}-{n}"
            perform(history, client, process, "append", thread, "turn/start",
                    {"thread_id": thread, "input": [{"text": value}]}, value=value)
        elif roll < 0.78:
            # Into the thread's durable queue when a turn runs (it starts in
            # order as the turns ahead end), at once when none does.
            value = f"q-{process}-{n}"
            perform(history, client, process, "enqueue", thread, "turn/start",
                    {"thread_id": thread, "input": [{"text": value}], "when_busy": "WHEN_BUSY_ENQUEUE"}, value=value)
        elif roll < 0.94:
            read_turns(history, client, process, thread)
        else:
            perform(history, client, process, "spawn", setup["spawn_root"], "agent/spawn",
                    {"parent_thread_id": setup["spawn_root"]},
                    result=lambda response: response.agent_spawn.thread.id)
        time.sleep(rng.uniform(0, 0.02))
    client.close()


def subscriber(index, args, setup, history, deadline):
    """Listens until the deadline, one connection after another: a new one
    (on the next instance) when one is lost or cannot subscribe. Each new
    connection resumes every thread after the last event number this
    subscriber handled (issue 49), as the clients' ResumingSubscription
    does: a number heard again is dropped, and a number that skips one is a
    change this subscriber never heard, which fails the run."""
    connect = connector(args.instances, index + 1)
    connections = 0
    last = {}  # thread -> the last event number handled
    while time.monotonic() < deadline:
        connections += 1
        name = f"s{index}.{connections}"
        try:
            client = connect()
        except OSError:
            time.sleep(0.2)
            continue
        try:
            replayed = {}  # thread -> the newest number when this connection resumed it
            for thread in setup["threads"]:
                params = {"thread_id": thread, "exclude_turns": True}
                if thread in last:
                    params["after_thread_sequence"] = last[thread]
                resumed = client.call("thread/resume", params)
                last.setdefault(thread, resumed.thread.thread_sequence)
                replayed[thread] = resumed.thread.thread_sequence
            while time.monotonic() < deadline:
                try:
                    client._pump(deadline=min(deadline, time.monotonic() + 0.5))
                except (TimeoutError, socket.timeout):
                    pass
                while client.notifications:
                    notification = client.notifications.pop(0)
                    thread = notification_thread_id(notification)
                    if notification.HasField("thread_sequence") and thread in last:
                        number = notification.thread_sequence
                        if number <= last[thread]:
                            continue  # heard before this connection
                        if number != last[thread] + 1:
                            raise AssertionError(f"subscriber {index} ({name}) heard event {number} of thread {thread} "
                                                 f"after {last[thread]}: the events between were never heard")
                        last[thread] = number
                        if number <= replayed[thread]:
                            # Sent again from the store: its notice would be
                            # a read spanning the whole cut, which only
                            # widens the checkers' search.
                            continue
                    record_notice(history, name, notification)
        except (OSError, StatusError):
            time.sleep(0.1)  # lost, or refused while an instance is cut off: try the next one
        finally:
            client.close()


def record_notice(history, connection, notification):
    # The thread's event number too: the checkers verify that each subscriber
    # (across its connections, "s0.1", "s0.2", ...) heard each number once, in order.
    number = {"number": notification.thread_sequence} if notification.HasField("thread_sequence") else {}
    kind = notification.WhichOneof("payload")
    if kind == "thread_settings_updated":
        note = notification.thread_settings_updated
        history.notice(connection, note.thread_id,
                       {"kind": "settings", "model": note.settings.model, "cwd": note.settings.cwd, **number})
    elif kind == "turn_started":
        note = notification.turn_started
        history.notice(connection, note.thread_id, {
            "kind": "turn", "input": next((item.text for item in note.turn.items if item.type == USER_MESSAGE), ""), **number})


TURN_IN_PROGRESS = 1


def settle_turns(client, threads, limit=30.0):
    """After the heal every turn must end: finished, or interrupted by the
    recovery of a dead owner's turns (within a lease or two), and every
    queued turn must have run. Returns the turns still running or queued
    after `limit` seconds, and how long it took."""
    started = time.monotonic()
    while True:
        running = []
        for thread in threads:
            turns = client.call("thread/read", {"thread_id": thread, "include_turns": True, "turns_limit": 1000}).thread.turns
            running += [f"{thread}/{turn.id}" for turn in turns if turn.status == TURN_IN_PROGRESS]
            queued = client.call("thread/queue/list", {"thread_id": thread}).data
            running += [f"{thread}/queued {entry.id}" for entry in queued]
        waited = time.monotonic() - started
        if not running or waited > limit:
            return running, round(waited, 2)
        time.sleep(0.2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--setup", required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--healed", required=True)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--setup-instance", type=int, default=0, help="the instance that creates (and first owns) the threads")
    parser.add_argument("--token", help="authenticate with this bearer token")
    args = parser.parse_args()
    global TOKEN
    TOKEN = args.token
    args.instances = args.instances.split(",")
    history = History(args.history)

    setup_client = retrying(args.instances, args.setup_instance)
    started = [setup_client.call("thread/start", {"name": f"chaos-{i}"}).thread for i in range(args.threads)]
    threads = [thread.id for thread in started]
    spawn_root = setup_client.call("thread/start", {"name": "spawn-root"}).thread.id
    # A thread spawns children once its first turn has resolved its runtime.
    setup_client.call("turn/start", {"thread_id": spawn_root, "input": [{"text": "ready to spawn"}]})
    while setup_client.call("thread/read", {"thread_id": spawn_root}).thread.status.type == 3:  # THREAD_STATUS_TYPE_ACTIVE
        time.sleep(0.02)
    setup_client.close()
    # The registers' values before the first write.
    initial = {f"{thread.id}:model": thread.model for thread in started}
    initial.update({f"{thread.id}:cwd": thread.cwd for thread in started})
    setup = {"threads": threads, "spawn_root": spawn_root, "initial": initial,
             # By the wall clock of the instance that made them (a skewed one shows).
             "created_at_ms": [thread.created_at for thread in started], "wall_clock_ms": int(time.time() * 1000)}
    Path(args.setup).write_text(json.dumps(setup))

    deadline = time.monotonic() + args.duration
    died = []

    def guarded(index):
        # A worker that dies (a status error its retries gave up on, a bug)
        # fails the run: its operations stop early and would go unchecked.
        try:
            worker(index, args, setup, history, deadline)
        except BaseException:
            died.append(f"worker {index}:\n{traceback.format_exc()}")

    def listening(index):
        try:
            subscriber(index, args, setup, history, deadline)
        except BaseException:
            died.append(f"subscriber {index}:\n{traceback.format_exc()}")

    workers = [threading.Thread(target=guarded, args=(i,)) for i in range(args.workers)]
    workers += [threading.Thread(target=listening, args=(i,)) for i in range(args.subscribers)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    if died:
        sys.exit("workload: " + "\n".join(died))

    # Final reads, once every fault is healed: what the store holds for good.
    while not os.path.exists(args.healed):
        time.sleep(0.05)
    time.sleep(args.settle)
    final = retrying(args.instances, 0)
    # Every thread must be read after the heal: the checker judges an
    # acknowledged change lost when no read holds it, and a run whose last
    # reads failed would leave its late changes in no read at all.
    for thread in threads:
        for read in (read_settings, read_turns):
            give_up = time.monotonic() + FINAL_READ_SECONDS
            while read(history, final, "final", thread) is None:
                if time.monotonic() > give_up:
                    sys.exit(f"workload: thread {thread} could not be read {FINAL_READ_SECONDS} s after the heal "
                             f"({read.__name__}); the cluster did not serve it again")
                time.sleep(0.2)
    children = final.call("thread/list", {"parent_thread_id": spawn_root, "limit": 100})
    setup["children"] = [thread.id for thread in children.data]
    setup["stuck_turns"], setup["turns_settled_after"] = settle_turns(final, threads + [spawn_root] + setup["children"])
    # By the owners' wall clocks: a test of clock faults sees them here.
    setup["turns_started_ms"] = [turn.started_at for thread in threads for turn in
                                 final.call("thread/read", {"thread_id": thread, "include_turns": True, "turns_limit": 1000}).thread.turns]
    Path(args.setup).write_text(json.dumps(setup))
    final.close()


if __name__ == "__main__":
    main()
