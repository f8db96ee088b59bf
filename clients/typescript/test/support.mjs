// Test support: the real server binary on a fresh store.
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

export const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/** Starts threadwire-server (THREADWIRE_SERVER_BIN, default the debug build); resolves { host, port, stop }. */
export async function startServer(extraArguments = []) {
  const binary = process.env.THREADWIRE_SERVER_BIN ?? join(root, ".build", "debug", "threadwire-server");
  const directory = mkdtempSync(join(tmpdir(), "threadwire-ts-"));
  const config = join(directory, "config.json");
  writeFileSync(config, JSON.stringify({ features: { multi_agent_v2: true, multi_agent_mode: true } }));
  const child = spawn(binary, ["--listen", "127.0.0.1:0", "--data-dir", join(directory, "store"), "--config", config,
    "--log-level", "error", ...extraArguments], { stdio: ["ignore", "pipe", "inherit"] });
  const line = await new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout });
    lines.once("line", resolve);
    child.once("exit", (code) => reject(new Error(`server exited with ${code}`)));
  });
  const match = /^threadwire listening on (.+):(\d+)$/.exec(line);
  if (!match) throw new Error(`unexpected first line: ${line}`);
  return {
    host: match[1],
    port: Number(match[2]),
    directory,
    async stop() {
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await exited;
      rmSync(directory, { recursive: true, force: true });
    },
  };
}

/** Reads notifications until `match` holds; returns all read. */
export async function waitFor(client, match, timeoutMs = 20000) {
  const seen = [];
  const deadline = setTimeout(() => {}, timeoutMs);
  const iterator = client.notifications();
  const timer = new Promise((_, reject) => setTimeout(() => reject(new Error(`no matching notification in ${timeoutMs} ms; saw ${seen.length}`)), timeoutMs).unref());
  try {
    for (;;) {
      const next = await Promise.race([iterator.next(), timer]);
      if (next.done) throw new Error("the connection ended");
      seen.push(next.value);
      if (match(next.value)) return seen;
    }
  } finally {
    clearTimeout(deadline);
  }
}
