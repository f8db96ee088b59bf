// What every threadwire client shares, whatever carries its Envelopes: the
// calls (pipelined, each settled by its own response), notifications in
// order, the server's calls to the client, status codes and errors. A
// transport subclasses BaseClient: Client (TCP frames, Node) and
// WebSocketClient (the web listener's /ws, browsers). No Node module here, so
// browsers load it as it is.

import {
  ApprovalParams,
  ApprovalResult,
  Envelope,
  InitializeResult,
  Notification,
  Request,
  Response,
  ServerRequest,
  ServerRequestAnswer,
  ToolCallParams,
  ToolCallResult,
  UserInputParams,
  UserInputResult,
} from "./gen/messages.js";
import { GeneratedCalls, serverRequestMethod, type CallOptions } from "./gen/methods.js";
import { DecodeError } from "./runtime.js";

/** The protocol version this package speaks. */
export const PROTOCOL_VERSION = 1;

/** gRPC status codes, as Response.code carries them. */
export enum Code {
  OK = 0,
  CANCELLED = 1,
  UNKNOWN = 2,
  INVALID_ARGUMENT = 3,
  DEADLINE_EXCEEDED = 4,
  NOT_FOUND = 5,
  ALREADY_EXISTS = 6,
  PERMISSION_DENIED = 7,
  RESOURCE_EXHAUSTED = 8,
  FAILED_PRECONDITION = 9,
  ABORTED = 10,
  OUT_OF_RANGE = 11,
  UNIMPLEMENTED = 12,
  INTERNAL = 13,
  UNAVAILABLE = 14,
  DATA_LOSS = 15,
  UNAUTHENTICATED = 16,
}

/** A failed call: the server's status code and message, or a local one
 * (UNAVAILABLE for a lost connection, DEADLINE_EXCEEDED and CANCELLED for an
 * aborted signal). */
export class StatusError extends Error {
  constructor(readonly code: Code, readonly details: string, options?: { cause?: unknown }) {
    super(`threadwire: ${Code[code] ?? `CODE(${code})`}: ${details}`, options);
    this.name = "StatusError";
  }
}

/** Serve the server's calls to this client. A handler that throws answers
 * INTERNAL with its message; a tool's own failure is a result with isError. */
export interface Handlers {
  tool?(params: ToolCallParams, request: ServerRequest): ToolCallResult | Promise<ToolCallResult>;
  approval?(params: ApprovalParams, request: ServerRequest): ApprovalResult | Promise<ApprovalResult>;
  userInput?(params: UserInputParams, request: ServerRequest): UserInputResult | Promise<UserInputResult>;
}

/** What a session declares and how it behaves, on any transport. */
export interface SessionOptions {
  /** Bearer token for a server that authenticates. */
  token?: string;
  clientName?: string;
  clientVersion?: string;
  /** Notification methods this connection never wants, e.g. "item/agent_message/delta". */
  optOut?: string[];
  handlers?: Handlers;
  /** false: leave the connection uninitialized (health/check and reflection/descriptors still work). */
  initialize?: boolean;
  /** Bounds the connection and the handshake. */
  signal?: AbortSignal;
  /** The largest message accepted from the server (default 64 MiB). */
  maxFrameBytes?: number;
  /** Notifications queued before the client stops reading until they are
   * consumed (default 1024), where the transport can stop reading (TCP);
   * responses wait too, and a server that finds the connection too slow
   * disconnects it. */
  notificationBuffer?: number;
}

interface Pending {
  resolve(response: Response): void;
  reject(error: unknown): void;
}

export function abortError(signal: AbortSignal): StatusError {
  const reason = signal.reason as { name?: string } | undefined;
  if (reason?.name === "TimeoutError") {
    return new StatusError(Code.DEADLINE_EXCEEDED, "the deadline passed before the response", { cause: signal.reason });
  }
  return new StatusError(Code.CANCELLED, "the call was cancelled", { cause: signal.reason });
}

/** gRPC's retry policy: up to maxAttempts in all after UNAVAILABLE or a lost
 * connection, with exponential backoff and full jitter. */
export interface RetryPolicy {
  maxAttempts: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
  multiplier: number;
  /** Response codes that are retried (UNAVAILABLE); a lost connection always is. */
  retryableCodes: readonly Code[];
}

/** 5 attempts, 100 ms doubling to at most 5 s. */
export const defaultRetryPolicy: Readonly<RetryPolicy> = Object.freeze({
  maxAttempts: 5,
  initialBackoffMs: 100,
  maxBackoffMs: 5000,
  multiplier: 2,
  retryableCodes: Object.freeze([Code.UNAVAILABLE]),
});

/**
 * One session with a threadwire server. Calls may be made concurrently: they
 * pipeline on the connection and each promise settles with its own response.
 */
export abstract class BaseClient extends GeneratedCalls {
  /** What initialize returned (undefined when the session was not initialized). */
  serverInfo?: InitializeResult;

  private nextId = 0n;
  private readonly pending = new Map<bigint, Pending>();
  private readonly queue: Notification[] = [];
  private readonly waiters: Array<(result: IteratorResult<Notification>) => void> = [];
  private closedError?: StatusError;
  private paused = false;

  protected constructor(protected readonly options: SessionOptions) {
    super();
  }

  /** Sends one encoded Envelope. */
  protected abstract transmit(envelope: Uint8Array): void;
  /** Stops reading from the server until resumeReading (a no-op where the transport cannot). */
  protected abstract pauseReading(): void;
  protected abstract resumeReading(): void;
  /** Ends the connection at once. */
  protected abstract destroy(): void;
  /** Ends the connection; calls still waiting fail with UNAVAILABLE. */
  abstract close(): Promise<void>;

  /** Initializes the session (unless options.initialize is false); closes it on failure. */
  protected async handshake(): Promise<void> {
    const options = this.options;
    if (options.initialize === false) return;
    try {
      const handlers = options.handlers ?? {};
      this.serverInfo = await this.initialize(
        {
          clientInfo: { name: options.clientName ?? "threadwire-typescript", version: options.clientVersion ?? "0.1.0" },
          protocolVersion: PROTOCOL_VERSION,
          capabilities: {
            optOutNotificationMethods: options.optOut ?? [],
            clientTools: handlers.tool !== undefined,
            approvals: handlers.approval !== undefined,
            userInput: handlers.userInput !== undefined,
          },
          authToken: options.token,
        },
        { signal: options.signal },
      );
    } catch (error) {
      await this.close();
      throw error;
    }
  }

  /** Sends a request and resolves with its response, whatever its code. */
  request(params: NonNullable<Request["params"]>, options: CallOptions = {}): Promise<Response> {
    if (this.closedError) return Promise.reject(this.closedError);
    const signal = options.signal;
    if (signal?.aborted) return Promise.reject(abortError(signal));
    const id = ++this.nextId;
    const request: Request = { id, params };
    if (options.timeoutMs !== undefined) request.timeoutMs = Math.min(Math.max(1, Math.ceil(options.timeoutMs)), 0xffffffff);
    if (options.idempotencyKey !== undefined) request.idempotencyKey = options.idempotencyKey;
    return new Promise<Response>((resolve, reject) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const cleanup = () => {
        this.pending.delete(id);
        signal?.removeEventListener("abort", onAbort);
        if (timer !== undefined) clearTimeout(timer);
      };
      // A response that comes after the wait ended is dropped.
      const onAbort = () => {
        cleanup();
        reject(abortError(signal!));
      };
      // The wait ends at the deadline, also when the response is read
      // before the timer's turn comes (a busy event loop): as the other
      // clients do, a response after the deadline is DEADLINE_EXCEEDED.
      const deadlineAt = options.timeoutMs !== undefined ? performance.now() + options.timeoutMs : undefined;
      this.pending.set(id, {
        resolve: (response) => {
          cleanup();
          if (deadlineAt !== undefined && performance.now() > deadlineAt) {
            reject(new StatusError(Code.DEADLINE_EXCEEDED, `no response within ${options.timeoutMs} ms`));
            return;
          }
          resolve(response);
        },
        reject: (error) => {
          cleanup();
          reject(error);
        },
      });
      signal?.addEventListener("abort", onAbort, { once: true });
      if (options.timeoutMs !== undefined) {
        timer = setTimeout(() => {
          cleanup();
          reject(new StatusError(Code.DEADLINE_EXCEEDED, `no response within ${options.timeoutMs} ms`));
        }, options.timeoutMs);
      }
      this.send({ kind: { case: "request", value: request } });
    });
  }

  protected async invoke(params: NonNullable<Request["params"]>, options?: CallOptions): Promise<Response> {
    const response = await this.request(params, options);
    const code = response.code ?? 0;
    if (code !== Code.OK) throw new StatusError(code, response.message ?? "");
    return response;
  }

  /** The notifications of subscribed threads, in order; ends when the connection does. One consumer at a time. */
  notifications(): AsyncIterableIterator<Notification> {
    const client = this;
    return {
      next(): Promise<IteratorResult<Notification>> {
        const note = client.queue.shift();
        if (note !== undefined) {
          client.resumeIfDrained();
          return Promise.resolve({ value: note, done: false });
        }
        if (client.closedError) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => client.waiters.push(resolve));
      },
      return(): Promise<IteratorResult<Notification>> {
        return Promise.resolve({ value: undefined, done: true });
      },
      [Symbol.asyncIterator]() {
        return this;
      },
    };
  }

  /** Whether the connection has ended (lost, closed or aborted): calls on it fail with UNAVAILABLE. */
  get ended(): boolean {
    return this.closedError !== undefined;
  }

  private send(envelope: Envelope): void {
    this.transmit(Envelope.encode(envelope).finish());
  }

  /** One Envelope from the server. */
  protected received(payload: Uint8Array): void {
    let envelope: Envelope;
    try {
      envelope = Envelope.decode(payload);
    } catch (error) {
      const reason = error instanceof DecodeError ? error.message : String(error);
      return this.abort(new StatusError(Code.INTERNAL, `undecodable message from the server: ${reason}`, { cause: error }));
    }
    this.dispatch(envelope);
  }

  private dispatch(envelope: Envelope): void {
    switch (envelope.kind?.case) {
      case "response": {
        const response = envelope.kind.value;
        const waiting = response.id === undefined ? undefined : this.pending.get(response.id);
        waiting?.resolve(response);
        break;
      }
      case "notification": {
        const waiter = this.waiters.shift();
        if (waiter) {
          waiter({ value: envelope.kind.value, done: false });
        } else {
          this.queue.push(envelope.kind.value);
          if (!this.paused && this.queue.length >= (this.options.notificationBuffer ?? 1024)) {
            this.paused = true;
            this.pauseReading();
          }
        }
        break;
      }
      case "serverRequest":
        void this.serve(envelope.kind.value);
        break;
      default:
        break;
    }
  }

  private resumeIfDrained(): void {
    if (this.paused && this.queue.length <= (this.options.notificationBuffer ?? 1024) / 2) {
      this.paused = false;
      this.resumeReading();
    }
  }

  private async serve(request: ServerRequest): Promise<void> {
    const handlers = this.options.handlers ?? {};
    const answer: ServerRequestAnswer = { id: request.id, code: Code.OK };
    try {
      const params = request.params;
      if (params?.case === "itemToolCall" && handlers.tool) {
        answer.result = { case: "itemToolCall", value: await handlers.tool(params.value, request) };
      } else if (params?.case === "itemToolRequestApproval" && handlers.approval) {
        answer.result = { case: "itemToolRequestApproval", value: await handlers.approval(params.value, request) };
      } else if (params?.case === "itemToolRequestUserInput" && handlers.userInput) {
        answer.result = { case: "itemToolRequestUserInput", value: await handlers.userInput(params.value, request) };
      } else {
        answer.code = Code.UNIMPLEMENTED;
        answer.message = `this client has no handler for ${serverRequestMethod(request)}`;
      }
    } catch (error) {
      answer.code = Code.INTERNAL;
      answer.message = error instanceof Error ? error.message : String(error);
      answer.result = undefined;
    }
    if (!this.closedError) this.send({ kind: { case: "serverRequestAnswer", value: answer } });
  }

  protected abort(error: StatusError): void {
    this.fail(error);
    this.destroy();
  }

  /** The connection ended (or failed): every waiting call fails with error. */
  protected fail(error: StatusError): void {
    if (this.closedError) return;
    this.closedError = error;
    for (const waiting of [...this.pending.values()]) waiting.reject(error);
    this.pending.clear();
    for (const waiter of this.waiters.splice(0)) waiter({ value: undefined, done: true });
  }
}
