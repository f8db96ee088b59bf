"""The cross-language conformance scenario in Python (see README.md here).
Usage: scenario.py ADDRESS, where ADDRESS is HOST:PORT (TCP frames),
ws://HOST:PORT/ws (a WebSocket, --web-listen) or grpc://HOST:PORT (a gRPC
Connect stream, --grpc-listen): the same session and transcript on each."""
import sys

from threadwire_client import Client, GRPCConnectClient, WebSocketClient


def connect(address):
    if address.startswith("ws://"):
        return WebSocketClient(address)
    if address.startswith("grpc://"):
        return GRPCConnectClient(address.removeprefix("grpc://"))
    host, port = address.rsplit(":", 1)
    return Client(host, int(port))


def main(address):
    with connect(address) as client:
        info = client.initialize("conformance-python", opt_out=["item/agent_message/delta", "thread/token_usage/updated"])
        print(f"initialize: protocol_version={info.protocol_version} server={info.server_info.name}")
        client.schema()  # wire names of notifications, from reflection/descriptors

        started = client.call("thread/start", {"multi_agent_mode": "MULTI_AGENT_MODE_PROACTIVE"})
        thread_id = started.thread.id
        mode = started.multi_agent_mode if started.HasField("multi_agent_mode") else None
        print(f"thread/start: selected_mode={name('MultiAgentMode', mode)}")

        turn = client.call("turn/start", {"thread_id": thread_id, "input": [{"text": "conformance"}]})
        print(f"turn/start: status={name('TurnStatus', turn.turn.status)}")
        methods, completed = [], None
        for note in client.iter_notifications():
            methods.append(client.notification_method(note))
            if note.WhichOneof("payload") == "turn_completed":
                completed = note.turn_completed.turn
                break
        print("notifications: " + " ".join(methods))
        items = ",".join(name("ItemType", item.type) for item in completed.items)
        print(f"turn/completed: status={name('TurnStatus', completed.status)} items={items}")

        updated = client.call("thread/settings/update", {"thread_id": thread_id, "clear_multi_agent_mode": True})
        mode = updated.settings.multi_agent_mode if updated.settings.HasField("multi_agent_mode") else None
        print(f"thread/settings/update: changed={str(updated.changed).lower()} selected_mode={name('MultiAgentMode', mode)}")

        # 1,000 requests written before any answer is read, then one whose
        # 1 ms deadline cannot be met: its answer queues behind the 1,000.
        ids = [client.send("thread/read", {"thread_id": thread_id}) if i % 2 == 0 else client.send("health/check")
               for i in range(1000)]
        late = client.send("thread/read", {"thread_id": thread_id}, timeout=0.001)
        responses = [client.wait(i) for i in ids]
        matched = all(r.id == i for r, i in zip(responses, ids)) and all(
            (r.WhichOneof("result") == "thread_read" and r.thread_read.thread.id == thread_id) if n % 2 == 0
            else r.WhichOneof("result") == "health_check" for n, r in enumerate(responses))
        ok = all(r.code == 0 for r in responses)
        print(f"pipelined: sent=1000 answered={len(responses)} ids={'matched' if matched else 'mismatched'} codes={'all_ok' if ok else 'errors'}")
        print(f"deadline: code={client.wait(late).code}")

        missing = client.wait(client.send("thread/read", {"thread_id": "no-such-thread"}))
        print(f"thread/read no-such-thread: code={missing.code}")


def name(enum, value):
    from threadwire_client import messages
    if value is None:
        return "none"
    for module in vars(messages).values():
        if enum in module.DESCRIPTOR.enum_types_by_name:
            return module.DESCRIPTOR.enum_types_by_name[enum].values_by_number[value].name
    raise KeyError(enum)


if __name__ == "__main__":
    main(sys.argv[1])
