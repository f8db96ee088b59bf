"""threadwire client: framed protobuf over TCP (see docs/protocol.md), or the
same session over a WebSocket or a gRPC Connect stream."""
from .client import (MUTATING_METHODS, Client, GRPCConnectClient, ReconnectingClient, ResumingSubscription, RetryPolicy, Schema,
                     StatusError, WebSocketClient, messages, notification_thread_id, tls_context)

__all__ = ["MUTATING_METHODS", "Client", "GRPCConnectClient", "ReconnectingClient", "ResumingSubscription", "RetryPolicy", "Schema",
           "StatusError", "WebSocketClient", "messages", "notification_thread_id", "tls_context"]
