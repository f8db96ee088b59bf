// threadwire's TypeScript client for browsers: the same calls, messages and
// resuming subscriptions as the Node entry, over the web listener's
// WebSocket (no Node module is loaded).
export { BaseClient, Code, PROTOCOL_VERSION, StatusError, defaultRetryPolicy, type Handlers, type RetryPolicy, type SessionOptions } from "./core.js";
export { WebSocketClient, type WebSocketLike, type WebSocketOptions } from "./websocket.js";
export * from "./gen/messages.js";
export { methodNames, notificationMethod, notificationNames, serverRequestMethod, serverRequestNames, type CallOptions } from "./gen/methods.js";
export { DecodeError, Reader, Writer, type MessageType } from "./runtime.js";
export { notificationThreadId, resumingSubscription, type ResumingOptions } from "./resume.js";
