// Starts a thread with a multi-agent mode, runs one turn, prints what the
// server reports. Usage: node examples/session.mjs [HOST] [PORT]
// (build first: tsc -p clients/typescript)
import { Client, MultiAgentMode, notificationMethod } from "../dist/index.js";

const [host = "127.0.0.1", port = "7420"] = process.argv.slice(2);
const client = await Client.connect({ host, port: Number(port), clientName: "ts-example", token: process.env.THREADWIRE_AUTH_TOKEN });
try {
  const started = await client.threadStart({ multiAgentMode: MultiAgentMode.MULTI_AGENT_MODE_PROACTIVE });
  console.log(`thread ${started.thread.id} mode ${MultiAgentMode[started.multiAgentMode]}`);
  const turn = await client.turnStart({ threadId: started.thread.id, input: [{ content: { case: "text", value: "hello from TypeScript" } }] });
  for await (const note of client.notifications()) {
    console.log(notificationMethod(note));
    if (note.payload?.case === "turnCompleted" && note.payload.value.turn?.id === turn.turn.id) {
      console.log(`turn status ${note.payload.value.turn.status}`);
      break;
    }
  }
} finally {
  await client.close();
}
