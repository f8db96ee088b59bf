// The TypeScript client's retry layer against the real server: a change
// retried across a crash applies once, reads and refusals, and its table of
// mutations against the server's reflection.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { Client, Code, ReconnectingClient, StatusError, mutates, methodNames } from "../dist/index.js";
import { freePort, startServer } from "./support.mjs";

const quickly = { maxAttempts: 40, initialBackoffMs: 20, maxBackoffMs: 200 };

test("a turn/start whose first attempt crashed the server after its commit is applied once, on a retry through a new connection", async () => {
  const directory = mkdtempSync(join(tmpdir(), "threadwire-ts-retry-"));
  const port = await freePort();
  let server = await startServer([], { directory, port });
  try {
    const setup = await Client.connect({ host: server.host, port });
    const threadId = (await setup.threadStart()).thread.id;
    await setup.close();
    await server.stop();

    // This server kills itself (SIGKILL) once the turn is committed, before
    // it answers; a clean one takes its place on the same store and port.
    const faulty = await startServer([], { directory, port, env: { THREADWIRE_FAULT_POINTS: "idempotency.after-change" } });
    server = faulty;
    const restarted = faulty.exited.then(async () => (server = await startServer([], { directory, port })));

    const retrying = ReconnectingClient.to({ host: faulty.host, port, clientName: "ts-retry" }, quickly);
    try {
      const started = await retrying.turnStart({ threadId, input: [{ content: { case: "text", value: "once" } }] });
      const ended = await Promise.race([faulty.exited, new Promise((resolve) => setTimeout(resolve, 5000, "still running").unref())]);
      assert.equal(ended, "SIGKILL", "the first attempt carried a key and reached the fault point after its commit");
      await restarted;
      assert.ok(retrying.connections >= 2, `the client reconnected (${retrying.connections} connections)`);

      const reader = await Client.connect({ host: server.host, port });
      try {
        const read = await reader.threadRead({ threadId, includeTurns: true });
        assert.deepEqual(read.thread.turns.map((turn) => turn.id), [started.turn.id], "exactly the answered turn");
      } finally {
        await reader.close();
      }
    } finally {
      await retrying.close();
    }
  } finally {
    await server.stop();
    rmSync(directory, { recursive: true, force: true });
  }
});

test("a refusal that cannot pass is returned at once, on the same connection", async () => {
  const server = await startServer();
  const retrying = ReconnectingClient.to({ host: server.host, port: server.port }, quickly);
  try {
    await assert.rejects(retrying.threadRead({ threadId: "no-such-thread" }), (error) => error instanceof StatusError && error.code === Code.NOT_FOUND);
    const settings = retrying.threadSettingsUpdate({ threadId: "no-such-thread", model: "m" });
    await assert.rejects(settings, (error) => error instanceof StatusError && error.code === Code.NOT_FOUND);
    assert.equal((await retrying.healthCheck()).status !== undefined, true);
    assert.equal(retrying.connections, 1);
  } finally {
    await retrying.close();
    await server.stop();
  }
});

test("with no server, each attempt dials again and the last UNAVAILABLE is the answer", async () => {
  const port = await freePort();
  let dials = 0;
  const retrying = new ReconnectingClient((signal) => {
    dials += 1;
    return Client.connect({ host: "127.0.0.1", port, signal });
  }, { maxAttempts: 3, initialBackoffMs: 1, maxBackoffMs: 5 });
  await assert.rejects(retrying.healthCheck(), (error) => error instanceof StatusError && error.code === Code.UNAVAILABLE);
  assert.equal(dials, 3);
  assert.equal(retrying.connections, 0);
  await retrying.close();
});

test("a key the call gives is sent: a repeat with it gets the first answer, other params with it are refused", async () => {
  const server = await startServer();
  const client = await Client.connect({ host: server.host, port: server.port });
  try {
    const threadId = (await client.threadStart()).thread.id;
    const retrying = ReconnectingClient.to({ host: server.host, port: server.port }, quickly);
    try {
      const first = await retrying.turnStart({ threadId, input: [{ content: { case: "text", value: "keyed" } }] }, { idempotencyKey: "ts-key-1" });
      const again = await retrying.turnStart({ threadId, input: [{ content: { case: "text", value: "keyed" } }] }, { idempotencyKey: "ts-key-1" });
      assert.equal(again.turn.id, first.turn.id);
      const read = await client.threadRead({ threadId, includeTurns: true });
      assert.equal(read.thread.turns.length, 1);
      const other = client.turnStart({ threadId, input: [{ content: { case: "text", value: "other params" } }] }, { idempotencyKey: "ts-key-1" });
      await assert.rejects(other, (error) => error instanceof StatusError && error.code === Code.INVALID_ARGUMENT);
    } finally {
      await retrying.close();
    }
  } finally {
    await client.close();
    await server.stop();
  }
});

test("the client's table of mutations matches the server's reflection", async () => {
  const server = await startServer();
  const client = await Client.connect({ host: server.host, port: server.port, initialize: false });
  try {
    const schema = await client.reflectionDescriptors();
    const cases = Object.fromEntries(Object.entries(methodNames).map(([field, name]) => [name, field]));
    assert.ok(schema.methods.length >= Object.keys(methodNames).length);
    for (const method of schema.methods) {
      const field = cases[method.name];
      assert.ok(field, `the client knows ${method.name}`);
      assert.equal(mutates({ case: field, value: {} }), method.mutates === true, `${method.name}: the server says mutates=${method.mutates}`);
    }
  } finally {
    await client.close();
    await server.stop();
  }
});
