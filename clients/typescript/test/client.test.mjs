// The TypeScript client against the real server.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import {
  Client, Code, StatusError, MultiAgentMode, TurnStatus, notificationMethod, methodNames, PROTOCOL_VERSION,
} from "../dist/index.js";
import { startServer, waitFor } from "./support.mjs";

let server;
before(async () => { server = await startServer(); });
after(async () => { await server.stop(); });

const connect = (options = {}) => Client.connect({ host: server.host, port: server.port, clientName: "ts-test", ...options });

test("a session: mode selected at start, a turn's notifications to turn/completed, a cleared mode", async () => {
  const client = await connect();
  try {
    assert.equal(client.serverInfo.protocolVersion, PROTOCOL_VERSION);
    const started = await client.threadStart({ multiAgentMode: MultiAgentMode.MULTI_AGENT_MODE_PROACTIVE });
    const threadId = started.thread.id;
    assert.equal(started.multiAgentMode, MultiAgentMode.MULTI_AGENT_MODE_PROACTIVE);
    const turn = await client.turnStart({ threadId, input: [{ content: { case: "text", value: "hello from TypeScript" } }] });
    const seen = await waitFor(client, (n) => n.payload?.case === "turnCompleted" && n.payload.value.turn?.id === turn.turn.id);
    const methods = seen.map(notificationMethod);
    for (const method of ["turn/started", "item/completed", "turn/completed"]) assert.ok(methods.includes(method), `${method} in ${methods}`);
    const sequences = seen.map((n) => n.sequence);
    assert.deepEqual(sequences, [...sequences].sort((a, b) => (a < b ? -1 : 1)), "notifications in sequence order");
    assert.equal(seen.at(-1).payload.value.turn.status, TurnStatus.TURN_STATUS_COMPLETED);
    const updated = await client.threadSettingsUpdate({ threadId, multiAgentModeUpdate: { case: "clearMultiAgentMode", value: true } });
    assert.equal(updated.changed, true);
    assert.equal(updated.settings.multiAgentMode, undefined);
  } finally {
    await client.close();
  }
});

test("errors carry the status code and message; the connection stays usable", async () => {
  const client = await connect();
  try {
    await assert.rejects(client.threadRead({ threadId: "no-such-thread" }), (error) => {
      assert.ok(error instanceof StatusError);
      assert.equal(error.code, Code.NOT_FOUND);
      assert.match(error.details, /no-such-thread/);
      return true;
    });
    await assert.rejects(client.turnStart({}), (error) => error.code === Code.INVALID_ARGUMENT);
    assert.equal((await client.healthCheck()).status, 1);
  } finally {
    await client.close();
  }
});

test("AbortSignal deadlines and cancellation", async () => {
  const client = await connect();
  try {
    const expired = AbortSignal.timeout(1);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await assert.rejects(client.healthCheck({}, { signal: expired }), (error) => error.code === Code.DEADLINE_EXCEEDED);
    const controller = new AbortController();
    const call = client.threadList({}, { signal: controller.signal });
    controller.abort();
    await assert.rejects(call, (error) => error.code === Code.CANCELLED);
    // A deadline that leaves time: sent as timeout_ms, and the call succeeds.
    const started = await client.threadStart({}, { timeoutMs: 5000, signal: AbortSignal.timeout(5000) });
    assert.ok(started.thread.id);
  } finally {
    await client.close();
  }
});

test("1,000 concurrent calls pipeline on one connection, each with its own answer", async () => {
  const client = await connect();
  try {
    const threadId = (await client.threadStart()).thread.id;
    const calls = Array.from({ length: 1000 }, (_, i) => (i % 2 === 0
      ? client.threadRead({ threadId }).then((read) => read.thread.id)
      : client.healthCheck().then((health) => health.status)));
    const results = await Promise.all(calls);
    results.forEach((result, i) => assert.equal(result, i % 2 === 0 ? threadId : 1));
  } finally {
    await client.close();
  }
});

test("a client tool the model calls reaches the handler, and its output reaches the turn", async () => {
  const calls = [];
  const client = await connect({
    handlers: { tool: (params) => { calls.push(params); return { output: "4 files" }; } },
  });
  try {
    const schema = JSON.stringify({ type: "object", properties: { dir: { type: "string" } }, required: ["dir"] });
    const threadId = (await client.threadStart({ clientTools: [{ name: "count_files", description: "Counts files", parametersJsonSchema: schema }] })).thread.id;
    await client.turnStart({ threadId, input: [{ content: { case: "text", value: '#tool count_files {"dir": "src"}' } }] });
    const seen = await waitFor(client, (n) => n.payload?.case === "turnCompleted");
    assert.equal(seen.at(-1).payload.value.turn.status, TurnStatus.TURN_STATUS_COMPLETED);
    assert.equal(calls.length, 1);
    assert.equal(calls[0].tool, "count_files");
    assert.deepEqual(JSON.parse(calls[0].arguments), { dir: "src" });
    const read = await client.threadRead({ threadId, includeTurns: true });
    assert.ok(read.thread.turns[0].items.some((item) => item.toolName === "count_files" && item.toolOutput === "4 files"));
  } finally {
    await client.close();
  }
});

test("reflection/descriptors before initialize", async () => {
  const client = await connect({ initialize: false });
  try {
    const schema = await client.reflectionDescriptors();
    assert.equal(schema.envelopeType, "threadwire.v1.Envelope");
    assert.ok(schema.fileDescriptorSet.length > 1000);
    const names = new Set(schema.methods.map((m) => m.name));
    assert.deepEqual(new Set(Object.values(methodNames)), names, "the generated method table is the server's");
    await assert.rejects(client.threadList(), (error) => error.code === Code.FAILED_PRECONDITION);
  } finally {
    await client.close();
  }
});

test("TLS with a bearer token", async (t) => {
  const directory = server.directory;
  const cert = join(directory, "cert.pem");
  const key = join(directory, "key.pem");
  execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", key, "-out", cert], { stdio: "ignore" });
  const tokens = join(directory, "tokens");
  writeFileSync(tokens, "alice alice-token-0123456789abcdef\n", { mode: 0o600 });
  const secure = await startServer(["--tls-cert", cert, "--tls-key", key, "--auth-tokens", tokens]);
  t.after(() => secure.stop());
  const ca = readFileSync(cert);
  const options = { host: secure.host, port: secure.port, tls: { ca, servername: "localhost" } };
  await assert.rejects(Client.connect(options), (error) => error.code === Code.UNAUTHENTICATED);
  await assert.rejects(Client.connect({ ...options, tls: { servername: "localhost" }, token: "alice-token-0123456789abcdef" }),
    // The handshake's own verdict, not any failed connect (also UNAVAILABLE).
    (error) => error.code === Code.UNAVAILABLE && error.cause?.code === "DEPTH_ZERO_SELF_SIGNED_CERT",
    "an unverified certificate fails the handshake");
  const client = await Client.connect({ ...options, token: "alice-token-0123456789abcdef" });
  try {
    assert.ok((await client.threadStart()).thread.id);
  } finally {
    await client.close();
  }
});

test("the example runs", () => {
  const out = execFileSync(process.execPath, [join(import.meta.dirname ?? new URL(".", import.meta.url).pathname, "..", "examples", "session.mjs"),
    server.host, String(server.port)], { encoding: "utf8" });
  assert.match(out, /mode MULTI_AGENT_MODE_PROACTIVE/);
  assert.match(out, /turn\/completed\nturn status 2\n$/);
});
