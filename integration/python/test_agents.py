"""Agents that act, from Python: client tools, approvals and user input
answered by the client's handlers on worker threads, on the real server."""
import json

from threadwire_client import Client, messages

TURN = messages.turn


def run_turn(client, thread_id, text):
    """Starts a turn and pumps (so handlers get their requests) until it completes."""
    turn_id = client.call("turn/start", {"thread_id": thread_id, "input": [{"text": text}]}).turn.id
    for notification in client.iter_notifications():
        if notification.WhichOneof("payload") == "turn_completed" and notification.turn_completed.turn.id == turn_id:
            return notification.turn_completed.turn


def test_client_tool_approved_and_user_input(server):
    with Client(*server) as client:
        seen = []
        client.on_tool("add", lambda args: json.dumps({"sum": args["a"] + args["b"]}))
        client.on_approval(lambda request, params: seen.append((request.thread_id, params.tool)) or "approve")
        client.on_user_input(lambda question, choices: choices[-1])
        client.initialize("python-agent")
        started = client.call("thread/start", {
            "approval_policy": "APPROVAL_POLICY_ALWAYS", "user_input": True,
            "client_tools": [{"name": "add", "description": "Adds.", "parameters_json_schema":
                              '{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]}'}],
        })
        assert started.approval_policy == messages.settings.APPROVAL_POLICY_ALWAYS
        thread_id = started.thread.id

        turn = run_turn(client, thread_id, '#tool add {"a": 2, "b": 3}')
        assert turn.status == TURN.TURN_STATUS_COMPLETED
        item = [i for i in turn.items if i.type == TURN.ITEM_TYPE_TOOL_CALL][0]
        assert item.status == TURN.ITEM_STATUS_COMPLETED
        assert json.loads(item.tool_output) == {"sum": 5}
        assert seen == [(thread_id, "add")], "the approval handler was asked first"

        turn = run_turn(client, thread_id, '#tool request_user_input {"question": "Which?", "choices": ["a", "b"]}')
        item = [i for i in turn.items if i.type == TURN.ITEM_TYPE_TOOL_CALL][0]
        assert item.tool_source == messages.server_request.TOOL_SOURCE_BUILTIN
        assert json.loads(item.tool_output) == {"answer": "b"}


def test_declined_and_failing_tool(server):
    with Client(*server) as client:
        client.on_tool("boom", lambda args: 1 / 0)
        client.on_approval(lambda request, params: ("decline", "not today") if params.arguments == '{"n":1}' else "approve")
        client.initialize("python-agent")
        thread_id = client.call("thread/start", {
            "approval_policy": "APPROVAL_POLICY_ALWAYS",
            "client_tools": [{"name": "boom", "parameters_json_schema": '{"type":"object"}'}],
        }).thread.id
        turn = run_turn(client, thread_id, '#tool boom {"n":1}\n#tool boom {"n":2}')
        first, second = [i for i in turn.items if i.type == TURN.ITEM_TYPE_TOOL_CALL]
        assert first.status == TURN.ITEM_STATUS_DECLINED and "not today" in first.tool_output
        assert second.status == TURN.ITEM_STATUS_FAILED and "ZeroDivisionError" in second.tool_output
        assert turn.status == TURN.TURN_STATUS_COMPLETED
