import * as net from "node:net";
import * as tls from "node:tls";

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

export interface ConnectOptions {
  host?: string;
  port?: number;
  /** Speak TLS: true for the system's CAs, or Node's TLS options (ca, cert, key, servername). */
  tls?: boolean | tls.ConnectionOptions;
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
  /** The largest frame accepted from the server (default 64 MiB). */
  maxFrameBytes?: number;
  /** Notifications queued before the client stops reading the socket until
   * they are consumed (default 1024); responses wait too, and a server that
   * finds the connection too slow disconnects it. */
  notificationBuffer?: number;
}

interface Pending {
  resolve(response: Response): void;
  reject(error: unknown): void;
}

const IP_ADDRESS = /^[\d.]+$|:/;

function abortError(signal: AbortSignal): StatusError {
  const reason = signal.reason as { name?: string } | undefined;
  if (reason?.name === "TimeoutError") {
    return new StatusError(Code.DEADLINE_EXCEEDED, "the deadline passed before the response", { cause: signal.reason });
  }
  return new StatusError(Code.CANCELLED, "the call was cancelled", { cause: signal.reason });
}

/**
 * One connection to a threadwire server. Calls may be made concurrently: they
 * pipeline on the connection and each promise settles with its own response.
 */
export class Client extends GeneratedCalls {
  /** What initialize returned (undefined when the connection was not initialized). */
  serverInfo?: InitializeResult;

  private nextId = 0n;
  private readonly pending = new Map<bigint, Pending>();
  private readonly queue: Notification[] = [];
  private readonly waiters: Array<(result: IteratorResult<Notification>) => void> = [];
  private buffer: Uint8Array = new Uint8Array(0);
  private closedError?: StatusError;
  private paused = false;
  private readonly closed: Promise<void>;

  private constructor(private readonly socket: net.Socket, private readonly options: ConnectOptions) {
    super();
    this.closed = new Promise((resolve) => socket.once("close", () => resolve()));
    socket.on("data", (chunk) => this.receive(chunk));
    socket.on("error", (error) => this.fail(new StatusError(Code.UNAVAILABLE, `connection lost: ${error.message}`, { cause: error })));
    socket.on("close", () => this.fail(new StatusError(Code.UNAVAILABLE, "the connection closed")));
  }

  /** Connects and (unless options.initialize is false) initializes. */
  static async connect(options: ConnectOptions = {}): Promise<Client> {
    const host = options.host ?? "127.0.0.1";
    const port = options.port ?? 7420;
    if (options.signal?.aborted) throw abortError(options.signal);
    let socket: net.Socket;
    if (options.tls) {
      const settings: tls.ConnectionOptions = options.tls === true ? {} : { ...options.tls };
      if (settings.servername === undefined && !IP_ADDRESS.test(host)) settings.servername = host;
      socket = tls.connect({ minVersion: "TLSv1.2", ...settings, host, port });
    } else {
      socket = net.connect({ host, port });
    }
    await new Promise<void>((resolve, reject) => {
      const onError = (error: Error) => {
        cleanup();
        reject(new StatusError(Code.UNAVAILABLE, error.message, { cause: error }));
      };
      const onConnect = () => {
        cleanup();
        resolve();
      };
      const onAbort = () => {
        cleanup();
        socket.destroy();
        reject(abortError(options.signal!));
      };
      const event = options.tls ? "secureConnect" : "connect";
      const cleanup = () => {
        socket.off("error", onError);
        socket.off(event, onConnect);
        options.signal?.removeEventListener("abort", onAbort);
      };
      socket.once("error", onError);
      socket.once(event, onConnect);
      options.signal?.addEventListener("abort", onAbort, { once: true });
    });
    socket.setNoDelay(true);
    const client = new Client(socket, options);
    if (options.initialize === false) return client;
    try {
      const handlers = options.handlers ?? {};
      client.serverInfo = await client.initialize(
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
      await client.close();
      throw error;
    }
    return client;
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

  /** Ends the connection; calls still waiting fail with UNAVAILABLE. */
  async close(): Promise<void> {
    if (!this.socket.destroyed) this.socket.end();
    const timer = setTimeout(() => this.socket.destroy(), 2000);
    await this.closed;
    clearTimeout(timer);
  }

  private send(envelope: Envelope): void {
    const payload = Envelope.encode(envelope).finish();
    const frame = new Uint8Array(5 + payload.length);
    new DataView(frame.buffer).setUint32(1, payload.length);
    frame.set(payload, 5);
    this.socket.write(frame);
  }

  private receive(chunk: Uint8Array): void {
    if (this.buffer.length === 0) {
      this.buffer = chunk;
    } else {
      const joined = new Uint8Array(this.buffer.length + chunk.length);
      joined.set(this.buffer);
      joined.set(chunk, this.buffer.length);
      this.buffer = joined;
    }
    const limit = this.options.maxFrameBytes ?? 64 * 1024 * 1024;
    let offset = 0;
    while (this.buffer.length - offset >= 5) {
      const view = new DataView(this.buffer.buffer, this.buffer.byteOffset + offset, 5);
      const flags = view.getUint8(0);
      const length = view.getUint32(1);
      if (flags !== 0) return this.abort(new StatusError(Code.INTERNAL, `the server sent a frame with flags 0x${flags.toString(16)}`));
      if (length > limit) return this.abort(new StatusError(Code.RESOURCE_EXHAUSTED, `the server sent a ${length}-byte frame, over this client's ${limit}`));
      if (this.buffer.length - offset < 5 + length) break;
      let envelope: Envelope;
      try {
        envelope = Envelope.decode(this.buffer.subarray(offset + 5, offset + 5 + length));
      } catch (error) {
        const reason = error instanceof DecodeError ? error.message : String(error);
        return this.abort(new StatusError(Code.INTERNAL, `undecodable frame from the server: ${reason}`, { cause: error }));
      }
      offset += 5 + length;
      this.dispatch(envelope);
    }
    this.buffer = offset === this.buffer.length ? new Uint8Array(0) : this.buffer.slice(offset);
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
            this.socket.pause();
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
      this.socket.resume();
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

  private abort(error: StatusError): void {
    this.fail(error);
    this.socket.destroy();
  }

  private fail(error: StatusError): void {
    if (this.closedError) return;
    this.closedError = error;
    for (const waiting of [...this.pending.values()]) waiting.reject(error);
    this.pending.clear();
    for (const waiter of this.waiters.splice(0)) waiter({ value: undefined, done: true });
  }
}
