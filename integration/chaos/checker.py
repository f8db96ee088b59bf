"""The history checker of the fault tests (issue 27): every client operation
is recorded (invocation, then completion: ok, fail or info) and the whole
history is checked at the end.

- Registers (a thread's settings fields): each (thread, field) is checked for
  linearizability on its own (P-compositionality) with the Wing & Gong search
  as Lowe improved it and porcupine implements it: linearize a call only
  before any pending return, memoize (linearized set, state), backtrack.
  A `fail` operation surely did not happen and is left out; an `info` one
  (timed out, connection lost, UNAVAILABLE after a retry) may have happened
  at any moment after its invocation, or never: its return is at infinity.
- Lists (a thread's turns; Elle's list-append idea, each turn/start appends
  its unique input): every acknowledged append appears exactly once in the
  final read, no element appears twice in any read, every element read was
  appended by some operation, reads are prefixes of one order, an append
  that completed before another began comes first, and a read that began
  after an append was acknowledged contains it (no stale read). An enqueue
  (turn/start with when_busy ENQUEUE) is an append that may land later, once
  the turns ahead of it end: acknowledged, it must be in the final read, once;
  it comes after every append or enqueue acknowledged before it began (the
  queue keeps order), but a read right after it need not hold it yet, and a
  plain turn/start may start ahead of it while the thread is idle.
- Snapshots (a thread/read's model and cwd, one response): the thread's
  settings as one register whose state is (model, cwd), each write setting
  one field, each snapshot read the pair; so a read that tears (one field
  from before a write, the other from after another) is found, which the
  per-field registers alone cannot see.
- Notices (what each subscribed connection heard, in the order it heard
  it): a thread/settings/updated is a snapshot read of (model, cwd) at its
  commit, which lies after both values' writes were invoked and before the
  notice arrived, so it joins the snapshot check; it never names a value
  nobody wrote or a refused write's; one connection hears each change at
  most once; a field's values come to every connection in one order, which
  agrees with real time and ends with the final read. A turn/started names
  an element of the final turn list, at most once per connection, in the
  list's order. Each notice carries its thread's event number: a
  subscriber (all its connections, which resume by number) hears each
  number at most once, in increasing order.
- Caps: the children an agent tree holds at the end are within the cap, and
  no acknowledged spawn is missing. Children are never closed, so their
  number only grows: the end is the highest point of the history.

A search that exceeds its budget is UNKNOWN, which is never a pass.
"""
import json
import math
from dataclasses import dataclass, field

INFINITY = math.inf


@dataclass
class Operation:
    process: str
    f: str            # "write", "read", "append", "list", "spawn", "snapshot", "notice"
    key: str          # "thread:field" for registers, the thread id for lists and caps
    value: object     # written value; read value (on ok); appended element
    invoked: float
    completed: float = INFINITY
    outcome: str = "info"  # "ok", "fail" or "info"
    index: int = 0


@dataclass
class Verdict:
    operations: int = 0
    acknowledged: int = 0
    failed: int = 0
    indeterminate: int = 0
    notices: int = 0      # what subscribers heard
    listeners: int = 0    # on how many connections
    anomalies: list = field(default_factory=list)
    unknown: list = field(default_factory=list)

    @property
    def valid(self):
        return not self.anomalies and not self.unknown

    def summary(self):
        state = "VALID" if self.valid else ("UNKNOWN" if not self.anomalies else "INVALID")
        return (f"checker: {state}: {self.operations - self.notices} operations, {self.acknowledged} acknowledged, {self.failed} failed, "
                f"{self.indeterminate} indeterminate, {self.notices} notices heard on {self.listeners} connections, "
                f"{len(self.anomalies)} anomalies"
                + (f", {len(self.unknown)} undecided within the budget" if self.unknown else ""))


def load(path):
    """Operations from a history file: one JSON object per line, either
    {"type": "invoke", "id": N, "process", "f", "key", "value", "time"} or
    {"type": "ok"|"fail"|"info", "id": N, "value", "time"}."""
    pending = {}
    operations = []
    with open(path) as lines:
        for line in lines:
            if not line.strip():
                continue
            event = json.loads(line)
            if event["type"] == "invoke":
                op = Operation(event["process"], event["f"], event["key"], event.get("value"), event["time"])
                pending[event["id"]] = op
                operations.append(op)
            else:
                op = pending.pop(event["id"])
                op.outcome = event["type"]
                if event["type"] in ("ok", "fail"):
                    op.completed = event["time"]
                if event["type"] == "ok" and op.f in ("read", "list", "spawn", "snapshot"):
                    op.value = event.get("value")
    return operations


# -- registers ----------------------------------------------------------------

def check_register(ops, initial=None, budget=2_000_000, apply=None):
    """True (linearizable), False, or None (budget exceeded). `ops` are one
    register's reads and writes; fails are left out by the caller.
    `apply(state, written)`: the state after a write (default: the value)."""
    ops = [op for op in ops if not (op.f == "read" and op.outcome != "ok")]  # an unanswered read constrains nothing
    for i, op in enumerate(ops):
        op.index = i
    # Events: (time, is_return, op); calls before returns at equal times.
    events = []
    for op in ops:
        events.append((op.invoked, 0, op.index))
        events.append((op.completed if op.outcome == "ok" else INFINITY, 1, op.index))
    events.sort()
    # A doubly linked list of events, as porcupine keeps it.
    n = len(events)
    nxt = [i + 1 if i + 1 < n else None for i in range(n)]
    prv = [i - 1 if i > 0 else None for i in range(n)]
    head = 0 if n else None
    # The return event's position of each op, to unlink it with its call.
    ret_pos = {}
    for pos, (_, is_return, index) in enumerate(events):
        if is_return:
            ret_pos[index] = pos

    def unlink(pos):
        nonlocal head
        p, q = prv[pos], nxt[pos]
        if p is None:
            head = q
        else:
            nxt[p] = q
        if q is not None:
            prv[q] = p

    def relink(pos):
        nonlocal head
        p, q = prv[pos], nxt[pos]
        if p is None:
            head = pos
        else:
            nxt[p] = pos
        if q is not None:
            prv[q] = pos

    def step(state, op):
        if op.f == "write":
            return True, apply(state, op.value) if apply else op.value
        return op.value == state, state

    linearized = 0  # bitset of op indexes
    state = initial
    cache = set()
    stack = []  # (call position, op index, previous state)
    entry = head
    steps = 0
    while head is not None:
        steps += 1
        if steps > budget:
            return None
        _, is_return, index = events[entry]
        if not is_return:
            ok, new_state = step(state, ops[index])
            key = (linearized | (1 << index), new_state)
            if ok and key not in cache:
                cache.add(key)
                stack.append((entry, index, state))
                state = new_state
                linearized |= 1 << index
                unlink(ret_pos[index])
                unlink(entry)
                entry = head
                continue
            entry = nxt[entry]
        else:
            # A return whose call is not linearized yet: undo the last choice.
            if not stack:
                return False
            call_pos, index, state = stack.pop()
            linearized &= ~(1 << index)
            relink(call_pos)
            relink(ret_pos[index])
            entry = nxt[call_pos]
    return True


# -- lists --------------------------------------------------------------------

def check_list(key, appends, reads, anomalies):
    """Checks one thread's turns (see the module's doc); appends anomalies."""
    by_element = {}
    for op in appends:
        by_element.setdefault(op.value, []).append(op)
    for element, ops in by_element.items():
        if len(ops) > 1:
            anomalies.append(f"{key}: the workload appended {element!r} twice (a workload bug)")
    answered = sorted((op for op in reads if op.outcome == "ok"), key=lambda op: op.invoked)
    longest = []
    for read in answered:
        seen = set()
        for element in read.value:
            if element in seen:
                anomalies.append(f"{key}: duplicate append: {element!r} appears twice in a read at {read.invoked:.3f}")
            seen.add(element)
            if element not in by_element:
                anomalies.append(f"{key}: {element!r} was read but never appended")
        shorter, longer = (read.value, longest) if len(read.value) <= len(longest) else (longest, read.value)
        if list(longer[:len(shorter)]) != list(shorter):
            anomalies.append(f"{key}: two reads are not prefixes of one order: {shorter[-3:]} vs {longer[:len(shorter)][-3:]}")
        if len(read.value) > len(longest):
            longest = list(read.value)
    # (appends here are both turn/starts and enqueues; see the module's doc.)
    # Real-time order of reads: a read that began after another ended sees at least as much.
    for earlier in answered:
        for later in answered:
            if later.invoked > earlier.completed and len(later.value) < len(earlier.value):
                anomalies.append(f"{key}: stale read: a read at {later.invoked:.3f} saw {len(later.value)} turns, "
                                 f"one finished before it at {earlier.completed:.3f} saw {len(earlier.value)}")
                break
    position = {element: i for i, element in enumerate(longest)}
    acknowledged = [op for op in appends if op.outcome == "ok"]
    for op in acknowledged:
        if op.value not in position:
            anomalies.append(f"{key}: lost append: {op.value!r} was acknowledged and is in no read")
        # No stale read: a read that began after the append's acknowledgement
        # contains it (an enqueued turn starts only when those ahead end).
        for read in (answered if op.f == "append" else []):
            if read.invoked > op.completed and op.value not in read.value:
                anomalies.append(f"{key}: stale read: {op.value!r} acknowledged at {op.completed:.3f}, "
                                 f"missing from a read that began at {read.invoked:.3f}")
                break
    # Real-time order of appends (a plain turn/start may pass a queued one).
    for a in acknowledged:
        for b in acknowledged:
            if a.f == "enqueue" and b.f == "append":
                continue
            if a.completed < b.invoked and a.value in position and b.value in position and position[a.value] > position[b.value]:
                anomalies.append(f"{key}: {b.value!r} comes before {a.value!r}, appended after it was acknowledged")
    for op in appends:
        if op.outcome == "fail" and op.value in position:
            anomalies.append(f"{key}: {op.value!r} was refused, yet appended")
    return longest


# -- everything -----------------------------------------------------------------

def check(operations, caps=None, initial=None, budget=2_000_000):
    """A Verdict for a whole history. `caps`: {tree: (cap, final children)};
    `initial`: {register key: its value before the first write}."""
    verdict = Verdict(operations=len(operations))
    heard_on = {op.process for op in operations if op.f == "notice"}
    verdict.notices, verdict.listeners = sum(1 for op in operations if op.f == "notice"), len(heard_on)
    for op in operations:
        if op.f == "notice":
            continue
        if op.outcome == "ok":
            verdict.acknowledged += 1
        elif op.outcome == "fail":
            verdict.failed += 1
        else:
            verdict.indeterminate += 1
    registers, lists = {}, {}
    for op in operations:
        if op.f in ("write", "read"):
            registers.setdefault(op.key, []).append(op)
        elif op.f in ("append", "enqueue", "list"):
            lists.setdefault(op.key, []).append(op)
    for key, ops in sorted(registers.items()):
        considered = [op for op in ops if op.outcome != "fail"]
        values = [op.value for op in considered if op.f == "write"]
        if len(values) != len(set(values)):
            verdict.anomalies.append(f"{key}: the workload wrote one value twice (a workload bug)")
            continue
        result = check_register(considered, initial=(initial or {}).get(key), budget=budget)
        if result is None:
            verdict.unknown.append(f"{key}: {len(considered)} operations not decided within {budget} steps")
        elif not result:
            verdict.anomalies.append(f"{key}: not linearizable ({explain_register(considered, (initial or {}).get(key))})")
    orders = {key: check_list(key, [op for op in ops if op.f in ("append", "enqueue")], [op for op in ops if op.f == "list"],
                              verdict.anomalies)
              for key, ops in sorted(lists.items())}
    heard = check_notices(operations, registers, orders, initial or {}, verdict.anomalies)
    check_snapshots(operations + heard, registers, initial or {}, budget, verdict)
    spawns = {}
    for op in operations:
        if op.f == "spawn":
            spawns.setdefault(op.key, []).append(op)
    for tree, (cap, children) in (caps or {}).items():
        if len(children) > cap:
            verdict.anomalies.append(f"{tree}: {len(children)} open children, over the cap of {cap}")
        for op in spawns.get(tree, []):
            if op.outcome == "ok" and op.value not in children:
                verdict.anomalies.append(f"{tree}: lost spawn: child {op.value} was acknowledged and is gone")
    return verdict


FIELDS = ("model", "cwd")


def check_snapshots(operations, registers, initial, budget, verdict):
    """Each thread's snapshot reads against the writes of both its fields."""
    snapshots = {}
    for op in operations:
        if op.f == "snapshot" and op.outcome == "ok":
            snapshots.setdefault(op.key, []).append(op)
    for thread, reads in sorted(snapshots.items()):
        ops = [Operation(r.process, "read", thread, tuple(r.value[f] for f in FIELDS), r.invoked, r.completed, r.outcome)
               for r in reads]
        for position, name in enumerate(FIELDS):
            for w in registers.get(f"{thread}:{name}", []):
                if w.f == "write" and w.outcome != "fail":
                    ops.append(Operation(w.process, "write", thread, (position, w.value), w.invoked, w.completed, w.outcome))
        start = tuple(initial.get(f"{thread}:{name}") for name in FIELDS)

        def apply(state, written):
            position, value = written
            return state[:position] + (value,) + state[position + 1:]

        result = check_register(ops, initial=start, budget=budget, apply=apply)
        if result is None:
            verdict.unknown.append(f"{thread} (model, cwd): {len(ops)} operations not decided within {budget} steps")
        elif not result:
            verdict.anomalies.append(f"{thread}: a thread/read's (model, cwd) matches no single moment of the history")


def check_notices(operations, registers, orders, initial, anomalies):
    """What subscribers heard (see the module's doc). Returns each settings
    notice as a snapshot read for `check_snapshots`."""
    writers = {(key, op.value): op for key, ops in registers.items() for op in ops if op.f == "write"}
    finals = {op.key: op.value for op in operations if op.f == "read" and op.process == "final" and op.outcome == "ok"}
    heard, once, last_position = [], set(), {}
    sequences = {}  # (thread, field) -> {connection: [values, in the order heard]}
    last_number = {}  # (subscriber, thread) -> the event number it heard last
    for notice in sorted((op for op in operations if op.f == "notice"), key=lambda op: op.invoked):
        thread, value, connection = notice.key, notice.value, notice.process
        if "number" in value:
            subscriber = connection.split(".")[0]
            number = value["number"]
            previous = last_number.get((subscriber, thread))
            if previous is not None and number <= previous:
                anomalies.append(f"{thread}: subscriber {subscriber} heard event {number} after event {previous} "
                                 + ("again" if number == previous else "(out of order)"))
            last_number[(subscriber, thread)] = max(number, previous or 0)
        if value["kind"] == "turn":
            element = value["input"]
            if (connection, thread, element) in once:
                anomalies.append(f"{thread}: connection {connection} heard turn {element!r} start twice")
                continue
            once.add((connection, thread, element))
            order = orders.get(thread, [])
            if element not in order:
                anomalies.append(f"{thread}: connection {connection} heard turn {element!r} start; no read holds it (never committed)")
                continue
            position = order.index(element)
            if position < last_position.get((connection, thread), -1):
                anomalies.append(f"{thread}: connection {connection} heard turn {element!r} start after a later one")
            last_position[(connection, thread)] = position
            continue
        pair = tuple(value[name] for name in FIELDS)
        if (connection, thread, pair) in once:
            anomalies.append(f"{thread}: connection {connection} heard settings {pair} twice")
            continue
        once.add((connection, thread, pair))
        earliest, made = 0.0, True
        for name, field_value in zip(FIELDS, pair):
            key = f"{thread}:{name}"
            heard_so_far = sequences.setdefault((thread, name), {}).setdefault(connection, [])
            if not heard_so_far or heard_so_far[-1] != field_value:
                heard_so_far.append(field_value)
            if field_value == initial.get(key):
                continue
            writer = writers.get((key, field_value))
            if writer is None or writer.outcome == "fail":
                anomalies.append(f"{key}: connection {connection} heard {field_value!r}, which was "
                                 + ("never written" if writer is None else "refused"))
                made = False
            else:
                earliest = max(earliest, writer.invoked)
        # Every connection's notice of one pair tells of one commit: one
        # read, ending when the first arrived (copies would only multiply
        # the search's equivalent orders).
        if made and (thread, pair) not in once:
            once.add((thread, pair))
            heard.append(Operation(connection, "snapshot", thread, dict(zip(FIELDS, pair)), earliest, notice.invoked, "ok"))
    for (thread, name), by_connection in sorted(sequences.items()):
        key = f"{thread}:{name}"
        cycle = order_cycle(key, by_connection, writers, initial.get(key), finals.get(key))
        if cycle:
            anomalies.append(f"{key}: subscribers heard its values in orders no single commit order explains: "
                             + " -> ".join(repr(v) for v in cycle))
    return heard


def order_cycle(key, by_connection, writers, initial, final):
    """A cycle in "committed before" among the values subscribers heard of
    one field (each connection's order, real time between acknowledged
    writes, the initial value first, the final read's last), or None."""
    values = sorted({v for heard in by_connection.values() for v in heard}, key=repr)
    after = {v: set() for v in values}
    for heard in by_connection.values():
        for a, b in zip(heard, heard[1:]):
            after[a].add(b)
    for a in values:
        for b in values:
            wa, wb = writers.get((key, a)), writers.get((key, b))
            if a == initial and b != initial:
                after[a].add(b)
            elif b == final and a != final:
                after[a].add(b)
            elif wa and wb and wa.outcome == "ok" and wa.completed < wb.invoked:
                after[a].add(b)
    state, path = {}, []

    def visit(v):
        state[v] = 1
        path.append(v)
        for w in sorted(after[v], key=repr):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        path.pop()
        state[v] = 2
        return None

    for v in values:
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def explain_register(ops, initial=None):
    """A short reason a register history failed: the first read that no
    write (or the initial value) could explain at its time."""
    writes = [op for op in ops if op.f == "write"]
    for read in sorted((op for op in ops if op.f == "read" and op.outcome == "ok"), key=lambda op: op.invoked):
        if read.value == initial:
            if any(w.completed < read.invoked for w in writes):
                return f"a read at {read.invoked:.3f} saw the initial value after a write was acknowledged"
            continue
        sources = [w for w in writes if w.value == read.value]
        if not sources:
            return f"a read at {read.invoked:.3f} saw {read.value!r}, which nobody wrote"
        if all(w.invoked > read.completed for w in sources):
            return f"a read at {read.invoked:.3f} saw {read.value!r} before it was written"
        newer = [w for w in writes if w.completed < read.invoked and w.invoked > sources[0].completed]
        if newer:
            return f"stale read: at {read.invoked:.3f} {read.value!r} was read after {newer[0].value!r} replaced it"
    return "no single order of the writes explains every read"
