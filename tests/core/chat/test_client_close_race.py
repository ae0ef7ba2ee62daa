"""Closing a chat client while one of its requests is still connecting leaves no socket open.

The chat window closes its client when it goes away or switches servers; a background
request (asking the server what it is) may be connecting at that moment.  The pool the
client closes does not know a connection that is still connecting, so that connection has
to close itself once its answer is in, or its socket stays open until garbage collection.
"""

from __future__ import annotations

import socket
from typing import Any

import httpcore
import httpx

from k3desk.core.chat.client import ChatClient, ChatEndpoint
from tests.core.chat.conftest import StandIn


class _ClosingBackend(httpcore.SyncBackend):
    """Connects, then closes the client (as the window would) before the request is sent."""

    def __init__(self) -> None:
        self.client: ChatClient | None = None
        self.sockets: list[socket.socket] = []

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        stream = super().connect_tcp(*args, **kwargs)
        self.sockets.append(stream.get_extra_info("socket"))
        if self.client is not None:
            self.client.close()
        return stream


def test_a_request_connecting_while_the_client_closes_closes_its_socket(
    standin: StandIn,
) -> None:
    backend = _ClosingBackend()
    transport = httpx.HTTPTransport()
    transport._pool._network_backend = backend  # the one seam httpx offers for this
    client = ChatClient(ChatEndpoint(standin.url), transport=transport)
    backend.client = client
    caps = client.capabilities()
    assert caps.vision  # the answer still arrived (the stand-in says it has vision)
    assert backend.sockets, "no connection was made"
    assert all(s.fileno() == -1 for s in backend.sockets), "a socket was left open"


def test_a_request_started_after_another_thread_closed_the_client_is_a_chat_error(
    standin: StandIn,
) -> None:
    """The window closes the client while a worker is about to ask the server what it is,
    or to send a question: the worker gets a ChatError it handles (a stream ends as
    stopped), never httpx's RuntimeError ("the client has been closed"), which reached a
    person as "Something went wrong" on closing with "Keep it running"."""
    import pytest

    from k3desk.core.chat.client import ChatMessage, ClientClosed

    client = ChatClient(ChatEndpoint(standin.url))
    client.capabilities()
    client.close()
    with pytest.raises(ClientClosed, match="was closed while a request was on its way"):
        client.capabilities(refresh=True)
    with client.stream([ChatMessage("user", "Hi")]) as st:
        assert list(st) == []
    assert st.result is not None
    assert st.result.cancelled
