"""Writes the committed seed corpus for the libFuzzer harnesses (make fuzz-corpus).

Seeds are envelopes built with Google's protobuf runtime (the Python client's
generated messages), so they come from a second implementation of the
contract: one file per envelope for `envelope`, its JSON form (proto field
names) for `json`, and for `frames` the same envelopes framed and run
together, behind the harness's two split-seed bytes.
"""
import os
import sys

from google.protobuf import json_format
from threadwire_client import messages

E = messages.envelope.Envelope


def envelopes():
    tid = "01a2009d-034d-7cb8-915e-5dcfcfc5f2ae"
    out = []

    def add(fill):
        e = E()
        fill(e)
        out.append(e)

    add(lambda e: (setattr(e.request, "id", 1), e.request.initialize.client_info.__setattr__("name", "seed"),
                   e.request.initialize.__setattr__("protocol_version", 1)))
    add(lambda e: (setattr(e.request, "id", 2), e.request.health_check.SetInParent()))
    add(lambda e: (setattr(e.request, "id", 3), e.request.thread_start.__setattr__("model", "gpt-x"),
                   e.request.thread_start.__setattr__("cwd", "/work"),
                   e.request.thread_start.config.add(key="features.multi_agent_v2", value="true"),
                   e.request.thread_start.__setattr__("multi_agent_mode", 2)))
    add(lambda e: (setattr(e.request, "id", 4), e.request.turn_start.__setattr__("thread_id", tid),
                   e.request.turn_start.input.add(text="hello \u00e9\u4e16"),
                   e.request.turn_start.__setattr__("model", "gpt-x")))
    add(lambda e: (setattr(e.request, "id", 5), e.request.thread_read.__setattr__("thread_id", tid),
                   e.request.thread_read.__setattr__("include_turns", True),
                   e.request.thread_read.__setattr__("turns_limit", 10)))
    add(lambda e: (setattr(e.request, "id", 6), e.request.thread_settings_update.__setattr__("thread_id", tid),
                   e.request.thread_settings_update.__setattr__("model", "m2")))
    add(lambda e: (setattr(e.request, "id", 7), e.request.thread_list.__setattr__("limit", 5),
                   e.request.thread_list.__setattr__("cursor", "c:1")))
    add(lambda e: (setattr(e.request, "id", 8), e.request.agent_spawn.__setattr__("parent_thread_id", tid),
                   e.request.agent_spawn.__setattr__("message", "do it")))
    add(lambda e: (setattr(e.request, "id", 9), e.request.turn_interrupt.__setattr__("thread_id", tid)))
    add(lambda e: (setattr(e.request, "id", 10), e.request.thread_turns_list.__setattr__("thread_id", tid)))

    def read_result(e):
        e.response.id = 11
        e.response.code = 0
        t = e.response.thread_read.thread
        t.id = tid
        t.model = "gpt-x"
        t.status.type = 1
        turn = t.turns.add(id="turn-1", status=2, started_at=1, completed_at=2)
        turn.items.add(id="item-1", type=1, text="hi")
        turn.items.add(id="item-2", type=2, text="echo: hi")
    add(read_result)

    def error(e):
        e.response.id = 12
        e.response.code = 3
        e.response.message = "thread_id is required"
    add(error)
    return out


def main(root):
    items = envelopes()
    for kind in ("envelope", "json", "frames"):
        os.makedirs(os.path.join(root, kind), exist_ok=True)
    framed = b""
    for index, e in enumerate(items):
        payload = e.SerializeToString()
        with open(os.path.join(root, "envelope", f"seed-{index:02d}"), "wb") as f:
            f.write(payload)
        text = json_format.MessageToJson(e, preserving_proto_field_name=True, indent=None)
        with open(os.path.join(root, "json", f"seed-{index:02d}.json"), "w") as f:
            f.write(text)
        frame = b"\x00" + len(payload).to_bytes(4, "big") + payload
        with open(os.path.join(root, "frames", f"seed-{index:02d}"), "wb") as f:
            f.write(b"\x13\x37" + frame)
        framed += frame
    with open(os.path.join(root, "frames", "seed-all"), "wb") as f:
        f.write(b"\x42\x01" + framed)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus"))
