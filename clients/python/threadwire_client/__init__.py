"""threadwire client: framed protobuf over TCP (see docs/protocol.md)."""
from .client import Client, Schema, StatusError, messages, tls_context

__all__ = ["Client", "Schema", "StatusError", "messages", "tls_context"]
