"""Context that lasts, from Python: names and search, steering, rollback and
compaction through the generic call(), on the real server."""
import threading

import pytest

from threadwire_client import Client, StatusError, messages

TURN = messages.turn


def wait_turn(client, turn_id):
    for notification in client.iter_notifications():
        if notification.WhichOneof("payload") == "turn_completed" and notification.turn_completed.turn.id == turn_id:
            return notification.turn_completed.turn


def run_turn(client, thread_id, text):
    return wait_turn(client, client.call("turn/start", {"thread_id": thread_id, "input": [{"text": text}]}).turn.id)


def test_name_search_steer_rollback_compact(server):
    with Client(*server) as client:
        # The steering input must arrive while the turn is inside a tool call,
        # so the tool waits for it (a timer would race the first model request).
        called, release = threading.Event(), threading.Event()
        client.on_tool("hold", lambda args: (called.set(), release.wait(30), "held")[-1])
        client.initialize("python-context")
        thread_id = client.call("thread/start", {
            "client_tools": [{"name": "hold", "parameters_json_schema": '{"type":"object"}'}]}).thread.id
        client.call("thread/name/set", {"thread_id": thread_id, "name": "Python naming test"})
        found = client.call("thread/list", {"search_term": "python NAMING"}).data
        assert [t.id for t in found] == [thread_id]
        with pytest.raises(StatusError) as short:
            client.call("thread/list", {"search_term": "py"})
        assert short.value.code == 3

        turn_id = client.call("turn/start", {"thread_id": thread_id, "input": [{"text": "#tool hold {}\nfirst"}]}).turn.id
        while not called.wait(0.05):
            client.call("health/check")  # reads the frames, the tool call among them
        steered = client.call("turn/steer", {"thread_id": thread_id, "expected_turn_id": turn_id, "input": [{"text": "second"}]})
        assert steered.turn_id == turn_id
        release.set()
        turn = wait_turn(client, turn_id)
        assert [i.type for i in turn.items] == [TURN.ITEM_TYPE_USER_MESSAGE, TURN.ITEM_TYPE_TOOL_CALL,
                                                TURN.ITEM_TYPE_USER_MESSAGE, TURN.ITEM_TYPE_AGENT_MESSAGE]
        assert turn.items[-1].text == "echo: second"
        read = client.call("thread/read", {"thread_id": thread_id, "include_turns": True, "include_model_requests": True})
        assert read.thread.turns[-1].model_requests[-1].context[-1].text == "second", "after the tool call finished"
        with pytest.raises(StatusError) as ended:
            client.call("turn/steer", {"thread_id": thread_id, "expected_turn_id": turn_id, "input": [{"text": "late"}]})
        assert ended.value.code == 9 and "has ended" in ended.value.message

        run_turn(client, thread_id, "to be taken back")
        rolled = client.call("thread/rollback", {"thread_id": thread_id, "num_turns": 1})
        assert len(rolled.turn_ids) == 1
        compaction = wait_turn(client, client.call("thread/compact/start", {"thread_id": thread_id}).turn.id)
        summary = [i.text for i in compaction.items if i.type == TURN.ITEM_TYPE_CONTEXT_COMPACTION]
        assert len(summary) == 1 and "first" in summary[0] and "taken back" not in summary[0]
