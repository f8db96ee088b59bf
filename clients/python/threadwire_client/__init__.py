"""threadwire client: framed protobuf over TCP (see docs/protocol.md)."""
from .client import (MUTATING_METHODS, Client, ReconnectingClient, ResumingSubscription, RetryPolicy, Schema, StatusError, messages,
                     notification_thread_id, tls_context)

__all__ = ["MUTATING_METHODS", "Client", "ReconnectingClient", "ResumingSubscription", "RetryPolicy", "Schema", "StatusError", "messages", "notification_thread_id", "tls_context"]
