"""The Cluster page's attached servers: a row per server, and which one the chat uses."""

from __future__ import annotations

from k3desk.core.app.presenters import Cell
from k3desk.core.cluster.endpoints import RemoteEndpoint

ENDPOINT_COLUMNS = ("Name", "URL", "Server", "Model", "API key", "Chat")


def server_text(ep: RemoteEndpoint) -> str:
    text = ep.server_text()
    if not text:
        return "not checked yet"
    return text


def key_text(ep: RemoteEndpoint) -> str:
    if ep.key_env:
        return f"from ${ep.key_env}"
    return "keyring" if ep.key_in_keyring else "none or this session's"


def endpoint_cells(ep: RemoteEndpoint, in_use: bool) -> tuple[Cell, ...]:
    """The row of ``ep`` (:data:`ENDPOINT_COLUMNS`): the kind in red when it answers but
    cannot chat, "in use" in green for the server the chat talks to."""
    return (
        Cell(ep.name),
        Cell(ep.url),
        Cell(server_text(ep), tone="danger" if ep.server_problem else None),
        Cell(ep.model or "—"),
        Cell(key_text(ep)),
        Cell("in use" if in_use else "", tone="ok" if in_use else None),
    )
