// The generated codec against Google's protobuf runtime (integration/typescript/oracle.py):
// every message type, random contents, byte-for-byte; truncated input refused
// exactly when Google refuses it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { join } from "node:path";

import * as threadwire from "../dist/index.js";
import { root } from "./support.mjs";

const python = process.env.THREADWIRE_PYTHON ?? join(root, ".build", "venv", "bin", "python");
const hex = (bytes) => Buffer.from(bytes).toString("hex");
const unhex = (text) => new Uint8Array(Buffer.from(text, "hex"));

test("decode then encode reproduces Google's bytes for every message type", () => {
  const { cases } = JSON.parse(execFileSync(python, [join(root, "integration", "typescript", "oracle.py")], { maxBuffer: 1 << 28 }));
  const types = new Set(cases.map((c) => c.type));
  assert.ok(types.size > 80, `cases for ${types.size} message types`);
  let refused = 0;
  for (const c of cases) {
    const type = threadwire[c.type];
    assert.ok(type?.decode, `no generated type ${c.type}`);
    if (!c.valid) {
      assert.throws(() => type.decode(unhex(c.hex)), threadwire.DecodeError, `${c.type} ${c.hex} must be refused`);
      refused++;
      continue;
    }
    const decoded = type.decode(unhex(c.hex));
    assert.equal(hex(type.encode(decoded).finish()), c.canonical, `${c.type} ${c.hex}`);
  }
  assert.ok(refused > 50, `${refused} truncated inputs refused`);
});

test("hostile input is refused with DecodeError, never a crash", () => {
  const { Envelope, DecodeError } = threadwire;
  // A varint that never ends, a length past the end, an invalid wire type,
  // invalid UTF-8 in a string, nesting past the limit.
  for (const bytes of [[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], [0x0a, 0x7f, 0x00], [0x0f],
    [0x0a, 0x06, 0x5a, 0x04, 0x0a, 0x02, 0xc3, 0x28]]) {
    assert.throws(() => Envelope.decode(new Uint8Array(bytes)), DecodeError, hex(bytes));
  }
  // 200 nested unknown groups.
  const deep = new Uint8Array(400);
  deep.fill(0x7b, 0, 200); // field 15, wire type 3 (start group)
  deep.fill(0x7c, 200); // end group
  assert.throws(() => Envelope.decode(deep), DecodeError);
});
