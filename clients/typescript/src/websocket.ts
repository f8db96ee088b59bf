import { abortError, BaseClient, Code, StatusError, type SessionOptions } from "./core.js";

/** What WebSocketClient needs of a WebSocket: the browser's, or any with its API. */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  readonly bufferedAmount: number;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: "open" | "close" | "error" | "message", listener: (event: any) => void): void;
  removeEventListener(type: "open" | "close" | "error" | "message", listener: (event: any) => void): void;
}

export interface WebSocketOptions extends SessionOptions {
  /** The web listener's session path, e.g. "ws://127.0.0.1:7423/ws" (wss:// with TLS in front). */
  url: string;
  /** Makes the socket (default: the global WebSocket, as in browsers and Node 22). */
  webSocket?: (url: string) => WebSocketLike;
}

const OPEN = 1;

/**
 * One session over the web listener's WebSocket (`--web-listen`, path `/ws`):
 * each binary message one Envelope, with the rules of a TCP connection
 * (initialize first, the token in it, pipelined calls, notifications in
 * order). For browsers, which cannot open TCP sockets. A browser reads a
 * WebSocket by itself, so notifications the application does not consume
 * queue in memory here rather than pushing back on the server.
 */
export class WebSocketClient extends BaseClient {
  private readonly closed: Promise<void>;

  private constructor(private readonly socket: WebSocketLike, options: WebSocketOptions) {
    super(options);
    this.closed = new Promise((resolve) => socket.addEventListener("close", () => resolve()));
    socket.addEventListener("message", (event: { data: unknown }) => {
      if (!(event.data instanceof ArrayBuffer)) {
        return this.abort(new StatusError(Code.INTERNAL, "the server sent a text message; the protocol is binary"));
      }
      const limit = this.options.maxFrameBytes ?? 64 * 1024 * 1024;
      if (event.data.byteLength > limit) {
        return this.abort(new StatusError(Code.RESOURCE_EXHAUSTED, `the server sent a ${event.data.byteLength}-byte message, over this client's ${limit}`));
      }
      this.received(new Uint8Array(event.data));
    });
    socket.addEventListener("close", (event: { code?: number; reason?: string }) => {
      const reason = event.reason ? `: ${event.reason}` : "";
      this.fail(new StatusError(Code.UNAVAILABLE, `the connection closed (WebSocket code ${event.code ?? "?"}${reason})`));
    });
  }

  /** Opens the WebSocket and (unless options.initialize is false) initializes. */
  static async connect(options: WebSocketOptions): Promise<WebSocketClient> {
    if (options.signal?.aborted) throw abortError(options.signal);
    const make = options.webSocket ?? ((url: string) => {
      const Native = (globalThis as { WebSocket?: new (url: string) => WebSocketLike }).WebSocket;
      if (Native === undefined) throw new StatusError(Code.UNIMPLEMENTED, "no global WebSocket here: pass options.webSocket");
      return new Native(url);
    });
    const socket = make(options.url);
    socket.binaryType = "arraybuffer";
    await new Promise<void>((resolve, reject) => {
      const onOpen = () => {
        cleanup();
        resolve();
      };
      // A refused upgrade (a wrong path, an origin not allowed) closes
      // without opening; the browser does not say why.
      const onClose = (event: { code?: number }) => {
        cleanup();
        reject(new StatusError(Code.UNAVAILABLE, `could not open ${options.url} (WebSocket code ${event.code ?? "?"})`));
      };
      const onAbort = () => {
        cleanup();
        // A socket closed while still connecting makes browsers log an
        // error (Firefox: "can't establish a connection"): it is closed
        // once it opens instead.
        if (socket.readyState === 0) socket.addEventListener("open", () => socket.close());
        else socket.close();
        reject(abortError(options.signal!));
      };
      const cleanup = () => {
        socket.removeEventListener("open", onOpen);
        socket.removeEventListener("close", onClose);
        options.signal?.removeEventListener("abort", onAbort);
      };
      socket.addEventListener("open", onOpen);
      socket.addEventListener("close", onClose);
      options.signal?.addEventListener("abort", onAbort, { once: true });
    });
    const client = new WebSocketClient(socket, options);
    await client.handshake();
    return client;
  }

  /** Ends the session; calls still waiting fail with UNAVAILABLE. */
  async close(): Promise<void> {
    if (this.socket.readyState <= OPEN) this.socket.close(1000);
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([this.closed, new Promise((resolve) => (timer = setTimeout(resolve, 2000)))]);
    clearTimeout(timer);
    // A server that never answers the close: the session is over all the same.
    this.fail(new StatusError(Code.UNAVAILABLE, "the connection closed"));
  }

  protected transmit(payload: Uint8Array): void {
    if (this.socket.readyState === OPEN) this.socket.send(payload);
  }

  // A browser's WebSocket cannot stop reading.
  protected pauseReading(): void {}
  protected resumeReading(): void {}

  protected destroy(): void {
    this.socket.close(1000);
  }
}
