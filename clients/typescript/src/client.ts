import * as net from "node:net";
import * as tls from "node:tls";

import { abortError, BaseClient, Code, StatusError, type SessionOptions } from "./core.js";

export { Code, PROTOCOL_VERSION, StatusError, type Handlers } from "./core.js";

export interface ConnectOptions extends SessionOptions {
  host?: string;
  port?: number;
  /** Speak TLS: true for the system's CAs, or Node's TLS options (ca, cert, key, servername). */
  tls?: boolean | tls.ConnectionOptions;
}

const IP_ADDRESS = /^[\d.]+$|:/;

/**
 * One TCP connection to a threadwire server (Node): Envelopes in
 * length-prefixed frames. Calls may be made concurrently: they pipeline on
 * the connection and each promise settles with its own response.
 */
export class Client extends BaseClient {
  private buffer: Uint8Array = new Uint8Array(0);
  private readonly closed: Promise<void>;

  private constructor(private readonly socket: net.Socket, options: ConnectOptions) {
    super(options);
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
    await client.handshake();
    return client;
  }

  /** Ends the connection; calls still waiting fail with UNAVAILABLE. */
  async close(): Promise<void> {
    if (!this.socket.destroyed) this.socket.end();
    const timer = setTimeout(() => this.socket.destroy(), 2000);
    await this.closed;
    clearTimeout(timer);
  }

  protected transmit(payload: Uint8Array): void {
    const frame = new Uint8Array(5 + payload.length);
    new DataView(frame.buffer).setUint32(1, payload.length);
    frame.set(payload, 5);
    this.socket.write(frame);
  }

  protected pauseReading(): void {
    this.socket.pause();
  }

  protected resumeReading(): void {
    this.socket.resume();
  }

  protected destroy(): void {
    this.socket.destroy();
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
    while (this.buffer.length - offset >= 5 && !this.ended) {
      const view = new DataView(this.buffer.buffer, this.buffer.byteOffset + offset, 5);
      const flags = view.getUint8(0);
      const length = view.getUint32(1);
      if (flags !== 0) return this.abort(new StatusError(Code.INTERNAL, `the server sent a frame with flags 0x${flags.toString(16)}`));
      if (length > limit) return this.abort(new StatusError(Code.RESOURCE_EXHAUSTED, `the server sent a ${length}-byte frame, over this client's ${limit}`));
      if (this.buffer.length - offset < 5 + length) break;
      const payload = this.buffer.subarray(offset + 5, offset + 5 + length);
      offset += 5 + length;
      this.received(payload);
    }
    this.buffer = offset === this.buffer.length ? new Uint8Array(0) : this.buffer.slice(offset);
  }
}
