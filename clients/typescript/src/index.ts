// threadwire's TypeScript client: protobuf Envelopes in length-prefixed frames
// over TCP (docs/protocol.md). Messages and typed calls are generated from
// proto/ by codegen/protoc_gen_ts.py.
export { Client, type ConnectOptions } from "./client.js";
export { BaseClient, Code, PROTOCOL_VERSION, StatusError, type Handlers, type SessionOptions } from "./core.js";
export { WebSocketClient, type WebSocketLike, type WebSocketOptions } from "./websocket.js";
export * from "./gen/messages.js";
export { methodNames, notificationMethod, notificationNames, serverRequestMethod, serverRequestNames, type CallOptions } from "./gen/methods.js";
export { DecodeError, Reader, Writer, type MessageType } from "./runtime.js";
export { ReconnectingClient, defaultRetryPolicy, mutatingMethods, mutates, newIdempotencyKey, type RetryPolicy } from "./retry.js";
export { notificationThreadId, resumingSubscription, type ResumingOptions } from "./resume.js";
