// Test support: the real server binary on a fresh store.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

export const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/** Starts threadwire-server (THREADWIRE_SERVER_BIN, default the debug build); resolves { host, port, stop, exited }.
 * `options`: `directory` (a store to reopen, kept by stop), `port` (default any free one), `env` (added to the server's). */
export async function startServer(extraArguments = [], options = {}) {
  const binary = process.env.THREADWIRE_SERVER_BIN ?? join(root, ".build", "debug", "threadwire-server");
  if (!existsSync(binary)) {
    throw new Error(`no threadwire-server at ${binary}: run \`swift build\` at the repository root (or \`make test-typescript\`), ` +
      "or set THREADWIRE_SERVER_BIN to a built server");
  }
  const keep = options.directory !== undefined;
  const directory = options.directory ?? mkdtempSync(join(tmpdir(), "threadwire-ts-"));
  const config = join(directory, "config.json");
  writeFileSync(config, JSON.stringify({ features: { multi_agent_v2: true, multi_agent_mode: true } }));
  const child = spawn(binary, ["--listen", `127.0.0.1:${options.port ?? 0}`, "--data-dir", join(directory, "store"), "--config", config,
    "--log-level", "error", ...extraArguments], { stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, ...(options.env ?? {}) } });
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve(signal ?? code)));
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
    /** Resolves with the exit code, or the signal that ended the server. */
    exited,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      await exited;
      if (!keep) rmSync(directory, { recursive: true, force: true });
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

/** A TCP port nothing listens on right now. */
export async function freePort() {
  const { createServer } = await import("node:net");
  const listener = createServer();
  await new Promise((resolve) => listener.listen(0, "127.0.0.1", resolve));
  const { port } = listener.address();
  await new Promise((resolve) => listener.close(resolve));
  return port;
}
