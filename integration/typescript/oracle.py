"""The oracle for the generated TypeScript codec: Google's protobuf runtime.

Writes JSON cases to stdout: random fully- and partly-populated messages of
every type in proto/, serialized by Google's runtime, and truncated copies
with Google's verdict (and its re-serialization when it accepts them). The
TypeScript test decodes each and re-encodes: the bytes must match exactly,
and it must refuse exactly what Google refuses.

Usage: oracle.py [--seed N] [--per-type N]"""
import argparse
import json
import math
import random
import struct

from google.protobuf import descriptor
from google.protobuf.message import DecodeError

from threadwire_client import messages

FD = descriptor.FieldDescriptor
TEXTS = ["", "a", "héllo ✓", "multi\nline", "emoji 🧵", "x" * 300, "\u0000 inside"]


def value_for(field, rng, depth):
    t = field.type
    if t == FD.TYPE_STRING:
        return rng.choice(TEXTS) + str(rng.randint(0, 9))
    if t == FD.TYPE_BYTES:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 20)))
    if t == FD.TYPE_BOOL:
        return rng.random() < 0.5
    if t == FD.TYPE_INT32:
        return rng.choice([0, 1, -1, 2**31 - 1, -(2**31), rng.randint(-(2**31), 2**31 - 1)])
    if t == FD.TYPE_UINT32:
        return rng.choice([0, 1, 127, 128, 2**32 - 1, rng.randint(0, 2**32 - 1)])
    if t == FD.TYPE_INT64:
        return rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randint(-(2**63), 2**63 - 1)])
    if t == FD.TYPE_UINT64:
        return rng.choice([0, 2**64 - 1, 2**53 + 1, rng.randint(0, 2**64 - 1)])
    if t == FD.TYPE_DOUBLE:
        return rng.choice([0.0, -0.0, 1.5, -2.25e300, math.inf, -math.inf, 5e-324, rng.uniform(-1e9, 1e9)])
    if t == FD.TYPE_ENUM:
        return rng.choice(field.enum_type.values).number
    raise SystemExit(f"no values for field type {t}")


def populate(message, rng, depth, density):
    for oneof in message.DESCRIPTOR.oneofs:
        if rng.random() < density:
            chosen = rng.choice(oneof.fields)
            set_field(message, chosen, rng, depth, density)
    for field in message.DESCRIPTOR.fields:
        if field.containing_oneof is not None or rng.random() >= density:
            continue
        set_field(message, field, rng, depth, density)


def set_field(message, field, rng, depth, density):
    repeated = field.is_repeated
    if field.type == FD.TYPE_MESSAGE:
        if depth >= 3:
            return
        if repeated:
            for _ in range(rng.randint(0, 3)):
                populate(getattr(message, field.name).add(), rng, depth + 1, density)
        else:
            child = getattr(message, field.name)
            child.SetInParent()
            populate(child, rng, depth + 1, density)
    elif repeated:
        getattr(message, field.name).extend(value_for(field, rng, depth) for _ in range(rng.randint(0, 3)))
    else:
        setattr(message, field.name, value_for(field, rng, depth))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--per-type", type=int, default=12)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    cases = []
    for module in vars(messages).values():
        for name, message_descriptor in module.DESCRIPTOR.message_types_by_name.items():
            cls = getattr(module, name)
            for n in range(args.per_type):
                message = cls()
                populate(message, rng, 0, 1.0 if n == 0 else rng.choice([0.2, 0.6, 0.9]))
                data = message.SerializeToString()
                cases.append({"type": name, "hex": data.hex(), "valid": True, "canonical": data.hex()})
                if len(data) > 1 and n < 4:
                    cut = data[:rng.randint(1, len(data) - 1)]
                    try:
                        parsed = cls.FromString(cut)
                        cases.append({"type": name, "hex": cut.hex(), "valid": True, "canonical": parsed.SerializeToString().hex()})
                    except DecodeError:
                        cases.append({"type": name, "hex": cut.hex(), "valid": False})
    print(json.dumps({"seed": args.seed, "cases": cases}))


if __name__ == "__main__":
    main()
