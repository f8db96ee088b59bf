"""threadwire client: framed protobuf over TCP (see docs/protocol.md)."""
from .client import Client, StatusError, messages, tls_context

__all__ = ["Client", "StatusError", "messages", "tls_context"]
