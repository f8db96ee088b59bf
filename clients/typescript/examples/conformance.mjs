// The cross-language conformance scenario (integration/conformance/README.md).
// Usage: node examples/conformance.mjs HOST:PORT
import { Client, ItemType, MultiAgentMode, TurnStatus, notificationMethod } from "../dist/index.js";

const [host, port] = process.argv[2].split(/:(?=\d+$)/);
const client = await Client.connect({ host, port: Number(port), clientName: "conformance-typescript",
  optOut: ["item/agent_message/delta", "thread/token_usage/updated"] });
const mode = (value) => (value === undefined ? "none" : MultiAgentMode[value]);
try {
  console.log(`initialize: protocol_version=${client.serverInfo.protocolVersion} server=${client.serverInfo.serverInfo.name}`);
  const started = await client.threadStart({ multiAgentMode: MultiAgentMode.MULTI_AGENT_MODE_PROACTIVE });
  const threadId = started.thread.id;
  console.log(`thread/start: selected_mode=${mode(started.multiAgentMode)}`);

  const turn = await client.turnStart({ threadId, input: [{ content: { case: "text", value: "conformance" } }] });
  console.log(`turn/start: status=${TurnStatus[turn.turn.status]}`);
  const methods = [];
  let completed;
  for await (const note of client.notifications()) {
    methods.push(notificationMethod(note));
    if (note.payload?.case === "turnCompleted") {
      completed = note.payload.value.turn;
      break;
    }
  }
  console.log(`notifications: ${methods.join(" ")}`);
  console.log(`turn/completed: status=${TurnStatus[completed.status]} items=${(completed.items ?? []).map((i) => ItemType[i.type]).join(",")}`);

  const updated = await client.threadSettingsUpdate({ threadId, multiAgentModeUpdate: { case: "clearMultiAgentMode", value: true } });
  console.log(`thread/settings/update: changed=${updated.changed === true} selected_mode=${mode(updated.settings.multiAgentMode)}`);

  // 1,000 requests written before any answer is read, then one whose 1 ms
  // deadline cannot be met: its answer queues behind the 1,000.
  const calls = Array.from({ length: 1000 }, (_, i) => client.request(i % 2 === 0
    ? { case: "threadRead", value: { threadId } } : { case: "healthCheck", value: {} }));
  const late = client.request({ case: "threadRead", value: { threadId } }, { timeoutMs: 1 }).then(
    (response) => response.code ?? 0, (error) => error.code);
  const responses = await Promise.all(calls);
  const matched = responses.every((r, i) => (i === 0 || r.id > responses[i - 1].id) && (i % 2 === 0
    ? r.result?.case === "threadRead" && r.result.value.thread.id === threadId : r.result?.case === "healthCheck"));
  const ok = responses.every((r) => (r.code ?? 0) === 0);
  console.log(`pipelined: sent=1000 answered=${responses.length} ids=${matched ? "matched" : "mismatched"} codes=${ok ? "all_ok" : "errors"}`);
  console.log(`deadline: code=${await late}`);

  const missing = await client.request({ case: "threadRead", value: { threadId: "no-such-thread" } });
  console.log(`thread/read no-such-thread: code=${missing.code}`);
} finally {
  await client.close();
}
