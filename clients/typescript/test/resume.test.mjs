// Issue 49 from TypeScript: resumingSubscription outlives a restart of the
// server and yields every kept event of the thread once, in order.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { Client, notificationThreadId, resumingSubscription } from "../dist/index.js";
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

test("a child agent spawned while the subscription's connection was down is yielded from its first event", async () => {
  const directory = mkdtempSync(join(tmpdir(), "threadwire-ts-resume-tree-"));
  const port = await freePort();
  let server = await startServer([], { directory, port });
  const abort = new AbortController();
  let away = false;
  try {
    let writer = await Client.connect({ host: server.host, port });
    const root = (await writer.threadStart()).thread.id;
    const turn = (await writer.turnStart({ threadId: root, input: [{ content: { case: "text", value: "resolve the runtime" } }] })).turn.id;
    for (let deadline = Date.now() + 10000; ; ) {
      const turns = (await writer.threadRead({ threadId: root, includeTurns: true })).thread.turns ?? [];
      if (turns.at(-1)?.id === turn && turns.at(-1).status !== 1) break;
      assert.ok(Date.now() < deadline, "the turn did not end");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const before = (await writer.threadRead({ threadId: root })).thread.threadSequence;
    const heard = new Map();
    const listening = (async () => {
      const subscription = resumingSubscription([root], {
        // While `away`, no connection is made: what happens meanwhile happens while the subscription is away.
        dial: async (signal) => {
          if (away) throw new Error("away");
          return Client.connect({ host: server.host, port, signal });
        },
        policy: { initialBackoffMs: 20, maxBackoffMs: 100 },
        after: new Map([[root, before]]),
        signal: abort.signal,
      });
      for await (const note of subscription) {
        if (note.threadSequence === undefined) continue;
        const id = notificationThreadId(note);
        heard.set(id, [...(heard.get(id) ?? []), [note.threadSequence, note.payload?.case]]);
      }
    })();
    await writer.threadSettingsUpdate({ threadId: root, model: "heard" });
    for (let deadline = Date.now() + 10000; (heard.get(root) ?? []).length < 1; ) {
      assert.ok(Date.now() < deadline, "the subscription heard nothing");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    away = true;
    await writer.close();
    await server.stop();
    server = await startServer([], { directory, port });
    writer = await Client.connect({ host: server.host, port });
    const child = (await writer.agentSpawn({ parentThreadId: root })).thread.id;
    for (let n = 0; n < 3; n++) await writer.threadSettingsUpdate({ threadId: child, model: `away-${n}` });
    away = false;
    const head = (await writer.threadRead({ threadId: child })).thread.threadSequence;
    for (let deadline = Date.now() + 20000; Date.now() < deadline && (heard.get(child) ?? []).at(-1)?.[0] !== head; ) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const numbers = (heard.get(child) ?? []).map(([number]) => number);
    assert.deepEqual(numbers, Array.from({ length: Number(head) }, (_, i) => BigInt(i + 1)), "the child's every event, from thread/started");
    assert.equal(heard.get(child)[0][1], "threadStarted");
    await writer.close();
    abort.abort();
    await listening;
  } finally {
    abort.abort();
    await server.stop();
    rmSync(directory, { recursive: true, force: true });
  }
});
