"""threadwire client: framed protobuf over TCP (see docs/protocol.md)."""
from .client import MUTATING_METHODS, Client, ReconnectingClient, RetryPolicy, Schema, StatusError, messages, tls_context

__all__ = ["MUTATING_METHODS", "Client", "ReconnectingClient", "RetryPolicy", "Schema", "StatusError", "messages", "tls_context"]
