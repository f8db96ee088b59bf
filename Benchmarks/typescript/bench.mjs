// Drives a threadwire server with the TypeScript client: closed loop (depth 1)
// or pipelined (depth N calls in flight per connection), printing one JSON
// line like Benchmarks/c/frame_load.c. Node runs every connection on one thread.
//
//   node bench.mjs HOST:PORT CONNECTIONS SECONDS health|read DEPTH [THREAD_ID]
import { Client } from "../../clients/typescript/dist/index.js";

const [address, connectionsText, secondsText, method, depthText, threadId] = process.argv.slice(2);
const [host, port] = address.split(/:(?=\d+$)/);
const connections = Number(connectionsText), seconds = Number(secondsText), depth = Number(depthText);
const clients = await Promise.all(Array.from({ length: connections }, () => Client.connect({ host, port: Number(port), clientName: "ts-bench" })));
const call = method === "read" ? (client) => client.threadRead({ threadId }) : (client) => client.healthCheck();
const latencies = [];
let errors = 0;
const warmup = performance.now() + 500;
const end = warmup + seconds * 1000;
async function loop(client) {
  for (;;) {
    const started = performance.now();
    if (started > end) return;
    try {
      await call(client);
    } catch {
      errors++;
    }
    if (started > warmup) latencies.push(performance.now() - started);
  }
}
await Promise.all(clients.flatMap((client) => Array.from({ length: depth }, () => loop(client))));
await Promise.all(clients.map((client) => client.close()));
latencies.sort((a, b) => a - b);
const pick = (q) => (latencies.length ? Math.round(latencies[Math.floor(q * (latencies.length - 1))] * 1000) : 0);
console.log(JSON.stringify({ client: "typescript", connections, depth, requests_per_second: Math.round(latencies.length / seconds),
  p50_us: pick(0.5), p99_us: pick(0.99), errors }));
