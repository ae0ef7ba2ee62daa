"""Remote endpoints: OpenAI-compatible servers elsewhere that the app chats with, kept in a
store and checked for reachability.  The shells list, add, check and remove them here.

The store keeps the keys that could not go to the system keyring for this session only, so
a shell opens it once (:func:`endpoint_store`) and passes it to each use-case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from k3desk.core.cluster.endpoints import EndpointStatus, EndpointStore, RemoteEndpoint

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

__all__ = [
    "EndpointRequest",
    "EndpointStatus",
    "EndpointStore",
    "RemoteEndpoint",
    "add_endpoint",
    "check_endpoint",
    "endpoint_store",
    "remove_endpoint",
    "set_endpoint_server",
]


@dataclass(frozen=True)
class EndpointRequest:
    """A server to attach, as a person gave it."""

    name: str
    url: str
    api_key: str | None = None  # kept in the keyring (else this session), never in the file
    key_env: str = ""  # or read from this environment variable when used
    model: str = ""
    check: bool = True  # the server must answer now
    replace_existing: bool = False
    server: str | None = None  # what kind of server it is; None or "auto": found out
    max_tokens_limit: int | None = None
    context_limit: int | None = None


def endpoint_store(services: Services) -> EndpointStore:
    """The attached endpoints (``<config>/endpoints.json``) and their keys."""
    return EndpointStore(services.paths)


def add_endpoint(store: EndpointStore, request: EndpointRequest) -> tuple[RemoteEndpoint, str]:
    """Attach ``request``; returns the endpoint as recorded and where its key went (in
    words).  A bad name, URL, kind or limit, a taken name, or (with ``check``) a server that
    does not answer raises :class:`~k3desk.core.errors.ClusterError` and saves nothing."""
    return store.add(
        request.name,
        request.url,
        api_key=request.api_key,
        key_env=request.key_env,
        model=request.model,
        check=request.check,
        replace_existing=request.replace_existing,
        server=request.server,
        max_tokens_limit=request.max_tokens_limit,
        context_limit=request.context_limit,
    )


def check_endpoint(store: EndpointStore, name: str) -> EndpointStatus:
    """Ask endpoint ``name`` now: up or down, its model, context and kind of server (what
    it found is kept with the endpoint)."""
    return store.status(name)


def set_endpoint_server(
    store: EndpointStore, name: str, server: str | None, *, check: bool = False
) -> tuple[RemoteEndpoint, EndpointStatus | None]:
    """Say what kind of server ``name`` is (None or "auto": find out again on next use);
    with ``check``, ask it at once."""
    ep = store.set_server(name, None if server == "auto" else server)
    return ep, (store.status(name) if check else None)


def remove_endpoint(store: EndpointStore, name: str) -> RemoteEndpoint:
    """Detach ``name`` and forget its key; returns what was attached."""
    return store.remove(name)
