import { BaseClient, Code, StatusError, defaultRetryPolicy, type RetryPolicy } from "./core.js";
import type { Notification } from "./gen/messages.js";

/** The thread a notification is about (undefined for none). */
export function notificationThreadId(note: Notification): string | undefined {
  const payload = note.payload;
  if (!payload) return undefined;
  if (payload.case === "threadStarted") return payload.value.thread?.id;
  return (payload.value as { threadId?: string }).threadId;
}

export interface ResumingOptions {
  /** Opens and initializes a connection (with the handlers the application serves). */
  dial: (signal?: AbortSignal) => Promise<BaseClient>;
  /** Backoff between failed connections (it dials for as long as it runs). */
  policy?: Partial<RetryPolicy>;
  /** Positions to start from; a thread not in it starts from its newest event. */
  after?: ReadonlyMap<string, bigint>;
  /** A thread's next event is no longer kept: re-read the thread; the
   * subscription goes on from its newest event. */
  onGap?: (threadId: string, message: string) => void;
  signal?: AbortSignal;
}

/**
 * Subscribes to threads over a connection dialled again whenever one ends (a
 * restart, a failover, a proxy cutting it, the server cutting a reader that
 * fell behind), each time resuming every thread after the last numbered event
 * it yielded (`thread/resume` with `afterThreadSequence`). Yields each kept
 * event once, in order; notifications that are not kept (deltas) pass through
 * as they come; thread/closed is left out, since the subscription goes on.
 * Child agents a subscribed root spawns are resumed too, each after its own
 * number, and those spawned while the connection was down from their first
 * event (found with thread/list by parent after each resume). Ends when
 * `signal` aborts.
 */
export async function* resumingSubscription(threads: readonly string[], options: ResumingOptions): AsyncGenerator<Notification> {
  const policy = { ...defaultRetryPolicy, ...options.policy };
  const last = new Map<string, bigint>(options.after ?? []);
  let attempt = 1;
  while (!options.signal?.aborted) {
    if (attempt > 1) {
      const ceiling = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * policy.multiplier ** Math.max(0, attempt - 2));
      await new Promise((resolve) => setTimeout(resolve, Math.random() * ceiling));
    }
    attempt = Math.min(attempt + 1, 32);
    let client: BaseClient;
    try {
      client = await options.dial(options.signal);
    } catch {
      continue;
    }
    try {
      const heard = [...last.keys()].filter((id) => !threads.includes(id)).sort();
      for (const id of [...threads, ...heard]) await resume(client, id, last, options);
      attempt = 1;
      const ended = new Promise<void>((resolve) => options.signal?.addEventListener("abort", () => resolve(), { once: true }));
      const notes = client.notifications();
      for (;;) {
        const next = await Promise.race([notes.next(), ended.then(() => ({ done: true as const, value: undefined }))]);
        if (next.done) break;
        const note = next.value;
        if (note.payload?.case === "threadClosed") continue;
        const id = notificationThreadId(note);
        if (note.threadSequence !== undefined && id !== undefined) {
          if (note.threadSequence <= (last.get(id) ?? 0n)) continue; // heard before the cut
          last.set(id, note.threadSequence);
        }
        yield note;
      }
    } catch (error) {
      if (!(error instanceof StatusError)) throw error;
    } finally {
      await client.close().catch(() => undefined);
    }
  }
}

/** Resumes the thread, then its child agents not heard of yet: from their
 * first event when the thread resumed from a position (they were spawned
 * while the subscription was away), else from their newest. */
async function resume(client: BaseClient, threadId: string, last: Map<string, bigint>, options: ResumingOptions): Promise<void> {
  const following = last.has(threadId);
  await resumeOne(client, threadId, last, options);
  let cursor: string | undefined;
  do {
    const page = await client.threadList({ parentThreadId: threadId, limit: 100, cursor });
    for (const child of page.data ?? []) {
      if (child.id === undefined || last.has(child.id)) continue;
      if (following) last.set(child.id, 0n);
      await resume(client, child.id, last, options);
    }
    cursor = page.nextCursor || undefined;
  } while (cursor !== undefined);
}

async function resumeOne(client: BaseClient, threadId: string, last: Map<string, bigint>, options: ResumingOptions): Promise<void> {
  const after = last.get(threadId);
  try {
    const result = await client.threadResume({ threadId, excludeTurns: true, afterThreadSequence: after });
    if (after === undefined) last.set(threadId, result.thread?.threadSequence ?? 0n);
  } catch (error) {
    if (!(error instanceof StatusError) || error.code !== Code.OUT_OF_RANGE) throw error;
    options.onGap?.(threadId, error.message);
    last.delete(threadId);
    await resumeOne(client, threadId, last, options);
  }
}
