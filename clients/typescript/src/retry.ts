import { randomUUID } from "node:crypto";

import { Client, type ConnectOptions } from "./client.js";
import { Code, StatusError, defaultRetryPolicy, type RetryPolicy } from "./core.js";

export { defaultRetryPolicy, type RetryPolicy } from "./core.js";
import type { Request, Response } from "./gen/messages.js";
import { GeneratedCalls, type CallOptions } from "./gen/methods.js";

type Params = NonNullable<Request["params"]>;

/** The methods that change state, by Request.params case (reflection/descriptors
 * marks the same as `mutates`): they are retried only with an idempotency key. */
export const mutatingMethods: ReadonlySet<Params["case"]> = new Set<Params["case"]>([
  "threadStart", "threadResume", "threadFork", "threadArchive", "threadUnarchive", "threadUnsubscribe",
  "threadSettingsUpdate", "agentSpawn", "threadToolsUpdate", "threadCompactStart", "threadRollback", "threadRevert", "threadQueueUpdate", "threadQueueDelete", "threadQueueReorder", "threadDelete",
  "threadNameSet", "turnStart", "turnInterrupt", "turnSteer", "turnContinue", "threadImport",
]);

/** Whether a request changes state. */
export function mutates(params: Params): boolean {
  return mutatingMethods.has(params.case);
}

/** A fresh idempotency key (a random UUID). */
export function newIdempotencyKey(): string {
  return randomUUID();
}

function pause(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function lostConnection(error: unknown): boolean {
  return error instanceof StatusError && error.code === Code.UNAVAILABLE;
}

/**
 * Calls that outlive a connection. `dial` opens a new initialized Client (it
 * may pick another instance each time); it is called when there is no
 * connection or the last one was lost. A change is sent with one idempotency
 * key (a new UUID unless the call gives one) on every attempt, so the server
 * applies it once however many attempts reach it; reads are retried as they
 * are. Subscriptions belong to a connection: after a reconnect (`connections`
 * grew), resume the threads to hear of them again, through `client()`.
 */
export class ReconnectingClient extends GeneratedCalls {
  readonly policy: Readonly<RetryPolicy>;
  /** How many connections were opened so far. */
  connections = 0;
  private current?: Promise<Client>;
  private closed = false;

  constructor(private readonly dial: (signal?: AbortSignal) => Promise<Client>, policy: Partial<RetryPolicy> = {}) {
    super();
    this.policy = { ...defaultRetryPolicy, ...policy, maxAttempts: Math.max(1, policy.maxAttempts ?? defaultRetryPolicy.maxAttempts) };
  }

  /** Connects with `options` on every (re)connect. */
  static to(options: ConnectOptions, policy: Partial<RetryPolicy> = {}): ReconnectingClient {
    return new ReconnectingClient((signal) => Client.connect({ ...options, signal: signal ?? options.signal }), policy);
  }

  /** The connection calls go out on now, opened if there is none (one dial
   * shared by concurrent callers). */
  async client(signal?: AbortSignal): Promise<Client> {
    for (;;) {
      if (this.closed) throw new StatusError(Code.UNAVAILABLE, "the reconnecting client was closed");
      const pending = this.current;
      if (!pending) break;
      const client = await pending.catch(() => undefined);
      if (client && !client.ended) return client;
      if (this.current === pending) {
        this.current = undefined;
        break;
      }
      // Another caller began a new dial meanwhile: share it.
    }
    const dialing = this.dial(signal);
    this.current = dialing;
    dialing.then(() => { this.connections += 1; }, () => { if (this.current === dialing) this.current = undefined; });
    return dialing;
  }

  /** Sends the request under the policy and resolves with the last response,
   * whatever its code; rejects only when no attempt got an answer. */
  async request(params: Params, options: CallOptions = {}): Promise<Response> {
    const sent: CallOptions = { ...options };
    if (sent.idempotencyKey === undefined && mutates(params)) sent.idempotencyKey = newIdempotencyKey();
    for (let attempt = 1; ; attempt++) {
      let client: Client | undefined;
      try {
        client = await this.client(options.signal);
        const response = await client.request(params, sent);
        if (!this.policy.retryableCodes.includes(response.code ?? 0) || attempt >= this.policy.maxAttempts) return response;
      } catch (error) {
        // A lost connection leaves the outcome unknown; the key makes a retry safe.
        if (!lostConnection(error) || this.closed) throw error;
        if (client) this.drop(client);
        if (attempt >= this.policy.maxAttempts) throw error;
      }
      await pause(this.backoff(attempt + 1), options.signal);
    }
  }

  protected override async invoke(params: Params, options?: CallOptions): Promise<Response> {
    const response = await this.request(params, options);
    const code = response.code ?? 0;
    if (code !== Code.OK) throw new StatusError(code, response.message ?? "");
    return response;
  }

  /** Closes the current connection; later calls fail with UNAVAILABLE. */
  async close(): Promise<void> {
    this.closed = true;
    const current = await this.current?.catch(() => undefined);
    this.current = undefined;
    await current?.close();
  }

  /** Milliseconds before attempt `attempt` (2, 3, ...): random up to the backoff. */
  private backoff(attempt: number): number {
    const ceiling = Math.min(this.policy.maxBackoffMs, this.policy.initialBackoffMs * this.policy.multiplier ** Math.max(0, attempt - 2));
    return Math.random() * ceiling;
  }

  private drop(lost: Client): void {
    void this.current?.then((client) => {
      if (client === lost) this.current = undefined;
    }, () => undefined);
    void lost.close();
  }
}
