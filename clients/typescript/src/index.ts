// threadwire's TypeScript client: protobuf Envelopes in length-prefixed frames
// over TCP (docs/protocol.md). Messages and typed calls are generated from
// proto/ by codegen/protoc_gen_ts.py.
export { Client, Code, PROTOCOL_VERSION, StatusError, type ConnectOptions, type Handlers } from "./client.js";
export * from "./gen/messages.js";
export { methodNames, notificationMethod, notificationNames, serverRequestMethod, serverRequestNames, type CallOptions } from "./gen/methods.js";
export { DecodeError, Reader, Writer, type MessageType } from "./runtime.js";
export { ReconnectingClient, defaultRetryPolicy, mutatingMethods, mutates, newIdempotencyKey, type RetryPolicy } from "./retry.js";
export { notificationThreadId, resumingSubscription, type ResumingOptions } from "./resume.js";
