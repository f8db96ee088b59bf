// Issue 49 from TypeScript: resumingSubscription outlives a restart of the
// server and yields every kept event of the thread once, in order.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { Client, resumingSubscription } from "../dist/index.js";
import { freePort, startServer } from "./support.mjs";

test("a resuming subscription outlives a restart of the server and yields every change once, in order", async () => {
  const directory = mkdtempSync(join(tmpdir(), "threadwire-ts-resume-"));
  const port = await freePort();
  let server = await startServer([], { directory, port });
  const abort = new AbortController();
  try {
    let writer = await Client.connect({ host: server.host, port });
    const threadId = (await writer.threadStart()).thread.id;
    const heard = [];
    const listening = (async () => {
      const subscription = resumingSubscription([threadId], {
        dial: (signal) => Client.connect({ host: server.host, port, signal }),
        policy: { initialBackoffMs: 20, maxBackoffMs: 200 },
        after: new Map([[threadId, 1n]]),
        signal: abort.signal,
      });
      for await (const note of subscription) if (note.threadSequence !== undefined) heard.push(note.threadSequence);
    })();
    for (let n = 0; n < 15; n++) await writer.threadSettingsUpdate({ threadId, model: `before-${n}` });
    await writer.close();
    await server.stop();
    server = await startServer([], { directory, port });
    writer = await Client.connect({ host: server.host, port });
    // Made at once, before the subscription has connected again.
    for (let n = 0; n < 15; n++) await writer.threadSettingsUpdate({ threadId, model: `after-${n}` });
    const head = (await writer.threadRead({ threadId })).thread.threadSequence;
    assert.equal(head, 31n);
    const deadline = Date.now() + 20000;
    while (Date.now() < deadline && heard.at(-1) !== head) await new Promise((resolve) => setTimeout(resolve, 20));
    assert.deepEqual(heard, Array.from({ length: 30 }, (_, i) => BigInt(i + 2)), "every change once, in order, across the restart");
    await writer.close();
    abort.abort();
    await listening;
  } finally {
    abort.abort();
    await server.stop();
    rmSync(directory, { recursive: true, force: true });
  }
});
