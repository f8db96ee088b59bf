"""The history checker on hand-made histories: each known anomaly is found,
valid histories pass, and a search over its budget is undecided, not a pass."""
import pytest

from checker import INFINITY, Operation, check


def w(key, value, start, end=INFINITY, outcome="ok", process="p"):
    return Operation(process, "write", key, value, start, end, outcome)


def r(key, value, start, end, process="q"):
    return Operation(process, "read", key, value, start, end, "ok")


def append(key, value, start, end=INFINITY, outcome="ok"):
    return Operation("a", "append", key, value, start, end, outcome)


def enqueue(key, value, start, end=INFINITY, outcome="ok"):
    return Operation("e", "enqueue", key, value, start, end, outcome)


def read_list(key, values, start, end):
    return Operation("l", "list", key, list(values), start, end, "ok")


def test_sequential_and_concurrent_histories_are_valid():
    history = [
        w("t:model", "a", 0, 1), r("t:model", "a", 2, 3), w("t:model", "b", 4, 10),
        r("t:model", "a", 5, 6),   # concurrent with the write: may see the old value
        r("t:model", "b", 7, 8),   # or the new one
        r("t:model", "b", 11, 12),
    ]
    verdict = check(history)
    assert verdict.valid, verdict.anomalies
    assert (verdict.operations, verdict.acknowledged, verdict.failed, verdict.indeterminate) == (6, 6, 0, 0)


def test_lost_update_is_found():
    history = [w("t:model", "a", 0, 1), w("t:model", "b", 2, 3), r("t:model", "a", 4, 5)]
    verdict = check(history)
    assert not verdict.valid and "not linearizable" in verdict.anomalies[0]


def test_stale_read_is_found():
    verdict = check([w("t:model", "a", 0, 1), r("t:model", None, 2, 3)])
    assert not verdict.valid and "initial value" in verdict.anomalies[0]


def test_indeterminate_write_may_apply_late_or_never_but_not_undo():
    maybe = w("t:model", "a", 0, outcome="info")
    assert check([maybe, r("t:model", None, 5, 6), r("t:model", "a", 7, 8)]).valid
    assert check([maybe, r("t:model", None, 5, 6)]).valid
    verdict = check([maybe, r("t:model", "a", 5, 6), r("t:model", None, 7, 8)])
    assert not verdict.valid, "a write that was seen cannot be undone"


def test_refused_write_must_not_be_seen():
    history = [w("t:model", "a", 0, 1, outcome="fail"), r("t:model", "a", 2, 3)]
    assert not check(history).valid


def test_duplicate_append_is_found():
    history = [append("t", "x", 0, 1), read_list("t", ["x", "x"], 2, 3)]
    verdict = check(history)
    assert any("duplicate append" in a for a in verdict.anomalies), verdict.anomalies


def test_lost_append_and_stale_list_read_are_found():
    lost = check([append("t", "x", 0, 1), read_list("t", [], 2, 3)])
    assert any("lost append" in a for a in lost.anomalies), lost.anomalies
    stale = check([append("t", "x", 0, 1), read_list("t", ["x"], 2, 3), read_list("t", [], 4, 5), read_list("t", ["x"], 6, 7)])
    assert any("stale read" in a for a in stale.anomalies), stale.anomalies


def test_append_order_and_phantoms_are_checked():
    order = check([append("t", "x", 0, 1), append("t", "y", 2, 3), read_list("t", ["y", "x"], 4, 5)])
    assert any("comes before" in a for a in order.anomalies), order.anomalies
    phantom = check([read_list("t", ["z"], 0, 1)])
    assert any("never appended" in a for a in phantom.anomalies), phantom.anomalies
    fine = check([append("t", "x", 0, 1), append("t", "y", 0.5, 3, outcome="info"), read_list("t", ["x", "y"], 4, 5)])
    assert fine.valid, fine.anomalies


def test_enqueues_land_later_in_order_and_are_never_lost():
    # Queued behind a running turn: a read right after the acknowledgement
    # need not hold it, and a plain turn/start may pass it; the final read must.
    later = check([append("t", "x", 0, 1), enqueue("t", "q", 1.5, 2), read_list("t", ["x"], 3, 4),
                   append("t", "y", 5, 6), read_list("t", ["x", "y", "q"], 10, 11)])
    assert later.valid, later.anomalies
    lost = check([append("t", "x", 0, 1), enqueue("t", "q", 1.5, 2), read_list("t", ["x"], 10, 11)])
    assert any("lost append" in a and "'q'" in a for a in lost.anomalies), lost.anomalies
    reordered = check([enqueue("t", "q1", 0, 1), enqueue("t", "q2", 2, 3), read_list("t", ["q2", "q1"], 10, 11)])
    assert any("comes before" in a for a in reordered.anomalies), reordered.anomalies
    behind = check([append("t", "x", 0, 1), enqueue("t", "q", 2, 3), read_list("t", ["q", "x"], 10, 11)])
    assert any("comes before" in a for a in behind.anomalies), "an enqueue lands behind a turn acknowledged before it"
    refused = check([enqueue("t", "q", 0, 1, outcome="fail"), read_list("t", ["q"], 10, 11)])
    assert any("refused, yet appended" in a for a in refused.anomalies), refused.anomalies


def test_caps_and_lost_spawns():
    spawn = Operation("s", "spawn", "root", "child-1", 0, 1, "ok")
    over = check([spawn], caps={"root": (1, ["child-1", "child-2"])})
    assert any("over the cap" in a for a in over.anomalies)
    lost = check([spawn], caps={"root": (2, [])})
    assert any("lost spawn" in a for a in lost.anomalies)
    assert check([spawn], caps={"root": (2, ["child-1"])}).valid


def test_a_search_over_budget_is_undecided_never_a_pass():
    # 22 writes that may each apply or not, and a read of a value nobody wrote:
    # refuting it means trying every subset.
    history = [w("t:model", f"v{i}", 0, outcome="info") for i in range(22)] + [r("t:model", "nobody", 1, 2)]
    verdict = check(history, budget=10_000)
    assert verdict.unknown and not verdict.valid
    assert "UNKNOWN" in verdict.summary()


def test_serving_overlaps_found_and_not_invented():
    from cluster import serving_overlaps

    def view(*held, valid=True):
        return {"held": [{"tree": t, "epoch": e} for t, e in held], "surely_valid": valid}

    handover = [("i1", view(("t", 1))), ("i2", view()), ("i1", view()), ("i2", view(("t", 2))), ("i1", view())]
    assert serving_overlaps(handover) == []
    # i1 stepped down (not surely valid) while i2 took over: no overlap.
    stepped_down = [("i1", view(("t", 1))), ("i1", view(("t", 1), valid=False)), ("i2", view(("t", 2))),
                    ("i1", view(("t", 1), valid=False))]
    assert serving_overlaps(stepped_down) == []
    # Planted: i1 serves t at epoch 1 before and after i2 serves it at epoch 2.
    planted = [("i1", view(("t", 1))), ("i2", view(("t", 2))), ("i3", view()), ("i1", view(("t", 1)))]
    assert serving_overlaps(planted) == ["t: i1 served it at epoch 1 before and after i2 served it at epoch 2"]


def snapshot(thread, model, cwd, start, end):
    return Operation("s", "snapshot", thread, {"model": model, "cwd": cwd}, start, end, "ok")


def test_a_torn_snapshot_is_found_though_each_field_alone_is_fine():
    initial = {"t:model": "m0", "t:cwd": "c0"}
    writes = [w("t:model", "m1", 0, 1), w("t:cwd", "c1", 2, 3)]
    # Each field alone: reading m0 during nothing... both reads below are
    # per-field linearizable; the pair (m0, c1) is not: c1 was written after
    # m1 was acknowledged, so no moment had m0 and c1 together.
    torn = writes + [r("t:model", "m0", 0.5, 4), r("t:cwd", "c1", 0.5, 4), snapshot("t", "m0", "c1", 0.5, 4)]
    verdict = check(torn, initial=initial)
    assert any("no single moment" in a for a in verdict.anomalies), verdict.anomalies
    assert not any(a.startswith("t:model") or a.startswith("t:cwd") for a in verdict.anomalies), verdict.anomalies
    whole = writes + [snapshot("t", "m1", "c0", 1.5, 1.8), snapshot("t", "m1", "c1", 3.5, 4)]
    assert check(whole, initial=initial).valid


# -- the second checker (gocheck, in Go) agrees on every hand-made history ----

def heard(connection, at, model=None, cwd=None, turn=None, thread="t", number=None):
    """What a subscribed connection heard at `at`: settings (model, cwd) or a turn's input, with its event number."""
    value = {"kind": "turn", "input": turn} if turn is not None else {"kind": "settings", "model": model, "cwd": cwd}
    if number is not None:
        value["number"] = number
    return Operation(connection, "notice", thread, value, at, at, "ok")


START = {"initial": {"t:model": "m0", "t:cwd": "c0"}}
TWO_WRITES = [w("t:model", "m1", 0, 1), w("t:cwd", "c1", 2, 3), Operation("final", "read", "t:model", "m1", 10, 11, "ok")]
TWO_TURNS = [append("t", "x", 0, 1), append("t", "y", 2, 3), read_list("t", ["x", "y"], 10, 11)]
MAYBE = w("t:model", "a", 0, outcome="info")
CASES = {
    "sequential and concurrent": ([w("t:model", "a", 0, 1), r("t:model", "a", 2, 3), w("t:model", "b", 4, 10),
                                   r("t:model", "a", 5, 6), r("t:model", "b", 7, 8), r("t:model", "b", 11, 12)], {}),
    "lost update": ([w("t:model", "a", 0, 1), w("t:model", "b", 2, 3), r("t:model", "a", 4, 5)], {}),
    "stale read": ([w("t:model", "a", 0, 1), r("t:model", None, 2, 3)], {}),
    "indeterminate applied late": ([MAYBE, r("t:model", None, 5, 6), r("t:model", "a", 7, 8)], {}),
    "indeterminate undone": ([MAYBE, r("t:model", "a", 5, 6), r("t:model", None, 7, 8)], {}),
    "refused write seen": ([w("t:model", "a", 0, 1, outcome="fail"), r("t:model", "a", 2, 3)], {}),
    "duplicate append": ([append("t", "x", 0, 1), read_list("t", ["x", "x"], 2, 3)], {}),
    "lost append": ([append("t", "x", 0, 1), read_list("t", [], 2, 3)], {}),
    "stale list": ([append("t", "x", 0, 1), read_list("t", ["x"], 2, 3), read_list("t", [], 4, 5)], {}),
    "append order": ([append("t", "x", 0, 1), append("t", "y", 2, 3), read_list("t", ["y", "x"], 4, 5)], {}),
    "phantom": ([read_list("t", ["z"], 0, 1)], {}),
    "lists fine": ([append("t", "x", 0, 1), append("t", "y", 0.5, 3, outcome="info"), read_list("t", ["x", "y"], 4, 5)], {}),
    "enqueued fine": ([append("t", "x", 0, 1), enqueue("t", "q", 1.5, 2), read_list("t", ["x"], 3, 4), append("t", "y", 5, 6),
                       read_list("t", ["x", "y", "q"], 10, 11)], {}),
    "lost enqueue": ([append("t", "x", 0, 1), enqueue("t", "q", 1.5, 2), read_list("t", ["x"], 10, 11)], {}),
    "enqueues reordered": ([enqueue("t", "q1", 0, 1), enqueue("t", "q2", 2, 3), read_list("t", ["q2", "q1"], 10, 11)], {}),
    "over the cap": ([Operation("s", "spawn", "root", "child-1", 0, 1, "ok")],
                     {"spawn_root": "root", "children": ["child-1", "child-2"], "cap": 1}),
    "lost spawn": ([Operation("s", "spawn", "root", "child-1", 0, 1, "ok")], {"spawn_root": "root", "children": [], "cap": 2}),
    "spawn fine": ([Operation("s", "spawn", "root", "child-1", 0, 1, "ok")],
                   {"spawn_root": "root", "children": ["child-1"], "cap": 2}),
    "torn snapshot": ([w("t:model", "m1", 0, 1), w("t:cwd", "c1", 2, 3), r("t:model", "m0", 0.5, 4), r("t:cwd", "c1", 0.5, 4),
                       snapshot("t", "m0", "c1", 0.5, 4)], {"initial": {"t:model": "m0", "t:cwd": "c0"}}),
    "whole snapshots": ([w("t:model", "m1", 0, 1), w("t:cwd", "c1", 2, 3), snapshot("t", "m1", "c0", 1.5, 1.8),
                         snapshot("t", "m1", "c1", 3.5, 4)], {"initial": {"t:model": "m0", "t:cwd": "c0"}}),
    "notices fine": (TWO_WRITES + [heard("s1", 1.5, "m1", "c0"), heard("s1", 3.5, "m1", "c1"),
                                    heard("s2", 3.6, "m1", "c1")], START),
    "notice heard twice": (TWO_WRITES + [heard("s1", 1.5, "m1", "c0"), heard("s1", 1.6, "m1", "c0")], START),
    "notice of a refused write": ([w("t:model", "m1", 0, 1, outcome="fail"), heard("s1", 1.5, "m1", "c0")], START),
    "notice of nothing written": ([heard("s1", 1.5, "m9", "c0")], START),
    "torn notice": (TWO_WRITES + [heard("s1", 4, "m0", "c1")], START),
    "notices against real time": ([w("t:model", "m1", 0, 1), w("t:model", "m2", 2, 3), heard("s1", 3.5, "m2", "c0"),
                                   heard("s1", 3.6, "m1", "c0")], START),
    "connections disagree": ([w("t:model", "m1", 0, 5), w("t:model", "m2", 0, 5), heard("s1", 5.1, "m1", "c0"),
                              heard("s1", 5.2, "m2", "c0"), heard("s2", 5.1, "m2", "c0"), heard("s2", 5.2, "m1", "c0")], START),
    "a notice after the final value": ([w("t:model", "m1", 0, 5), w("t:model", "m2", 0, 5), heard("s1", 5.1, "m2", "c0"),
                                        heard("s1", 5.2, "m1", "c0"), Operation("final", "read", "t:model", "m2", 10, 11, "ok")],
                                       START),
    "turn notices fine": (TWO_TURNS + [heard("s1", 1.5, turn="x"), heard("s1", 3.5, turn="y")], {}),
    "turn heard twice": (TWO_TURNS + [heard("s1", 1.5, turn="x"), heard("s1", 1.6, turn="x")], {}),
    "turn heard out of order": (TWO_TURNS + [heard("s1", 3.5, turn="y"), heard("s1", 3.6, turn="x")], {}),
    "turn heard, never committed": (TWO_TURNS + [heard("s1", 3.5, turn="z")], {}),
    # One subscriber, two connections (it resumed by number between them).
    "numbered notices fine": (TWO_WRITES + [heard("s1.1", 1.5, "m1", "c0", number=2), heard("s1.2", 3.5, "m1", "c1", number=3)],
                              START),
    "numbered notice heard again": (TWO_WRITES + [heard("s1.1", 1.5, "m1", "c0", number=2),
                                                  heard("s1.2", 3.5, "m1", "c1", number=2)], START),
    "numbered notices out of order": (TWO_TURNS + [heard("s1.1", 3.5, turn="y", number=3), heard("s1.2", 3.6, turn="x", number=2)],
                                      {}),
}


def python_verdict(operations, spawn_root="", children=(), cap=3, initial=None):
    verdict = check(operations, caps={spawn_root: (cap, list(children))} if spawn_root else None, initial=initial)
    return "VALID" if verdict.valid else ("INVALID" if verdict.anomalies else "UNKNOWN")


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_two_checkers_agree(name, tmp_path):
    import second_checker
    operations, options = CASES[name]
    cap = options.get("cap", 3)
    expected = python_verdict(operations, options.get("spawn_root", ""), options.get("children", ()), cap, options.get("initial"))
    second_checker.write(operations, tmp_path / "history", tmp_path / "setup", initial=options.get("initial"),
                         spawn_root=options.get("spawn_root", ""), children=options.get("children", ()))
    verdict, anomalies = second_checker.verdict(tmp_path / "history", tmp_path / "setup", cap)
    assert verdict == expected, anomalies
    assert (verdict == "VALID") == (name in {"sequential and concurrent", "indeterminate applied late", "lists fine", "enqueued fine",
                                             "spawn fine", "whole snapshots", "notices fine", "turn notices fine",
                                             "numbered notices fine"}), \
        "a planted anomaly was missed"
