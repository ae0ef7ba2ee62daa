"""Remote endpoints: OpenAI-compatible servers elsewhere that the app chats with, kept in a
store and checked for reachability.  The shells list, add, check and remove them here."""

from __future__ import annotations

from k3desk.core.cluster.endpoints import EndpointStatus, EndpointStore, RemoteEndpoint

__all__ = ["EndpointStatus", "EndpointStore", "RemoteEndpoint"]
