// The few Node APIs the client uses, declared here because no @types/node is
// reachable offline (Debian ships tsc, not Node's type packages).
declare module "node:net" {
  export interface Socket {
    write(data: Uint8Array, callback?: (error?: Error | null) => void): boolean;
    end(): this;
    destroy(error?: Error): this;
    setNoDelay(noDelay?: boolean): this;
    pause(): this;
    resume(): this;
    readonly destroyed: boolean;
    on(event: "data", listener: (chunk: Uint8Array) => void): this;
    on(event: "error", listener: (error: Error) => void): this;
    on(event: "close" | "drain" | "connect" | "secureConnect", listener: () => void): this;
    once(event: "error", listener: (error: Error) => void): this;
    once(event: "close" | "drain" | "connect" | "secureConnect", listener: () => void): this;
    off(event: string, listener: (...args: any[]) => void): this;
  }
  export function connect(options: { host: string; port: number }): Socket;
}

declare module "node:tls" {
  import type { Socket } from "node:net";
  export interface ConnectionOptions {
    host?: string;
    port?: number;
    servername?: string;
    ca?: string | Uint8Array | Array<string | Uint8Array>;
    cert?: string | Uint8Array;
    key?: string | Uint8Array;
    rejectUnauthorized?: boolean;
    minVersion?: "TLSv1.2" | "TLSv1.3";
  }
  export function connect(options: ConnectionOptions): Socket;
}

declare module "node:crypto" {
  export function randomUUID(): string;
}
