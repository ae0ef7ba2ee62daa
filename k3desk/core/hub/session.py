"""Bounds on what a server may make huggingface_hub's HTTP session read into memory.

huggingface_hub reads API answers (model info, file listings) and the bodies of
redirects whole, with no limit: a hostile server, or a broken mirror behind
``HF_ENDPOINT``, could answer with an endless or gzip-bombed body and take all
the memory there is.  :func:`guard_session` adds a response hook to the shared
session (``huggingface_hub.get_session``) that caps, as they are decoded, the
bodies of API answers and of redirects at :data:`MAX_BODY` bytes; file content
(``/resolve/`` answers, the CDN) is streamed by the transfer and bounded by the
listed size there.

It also adds a request hook that keeps the HF token on the Hub's own origin: while
:func:`token_only_to` is in force (a listing), a request carrying ``Authorization``
to any other origin is refused before it is sent, whoever built it (a pagination
link, a redirect, huggingface_hub itself).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

MAX_BODY = 32 * 1024 * 1024  # a 1000-file repository lists in well under 1 MiB

_lock = threading.Lock()


class BodyTooLong(Exception):
    """A server sent more than it may (an API answer over MAX_BODY, a file over its size)."""


class TokenRefused(Exception):
    """A request would have carried the HF token to an origin other than the Hub's."""


# the origin the token may go to, in this thread's current listing (None: no rule here)
_TOKEN_ORIGIN: ContextVar[str | None] = ContextVar("k3desk_token_origin", default=None)


def origin(url: object) -> str:
    """``scheme://host:port`` of ``url`` (the default port written out), lower-cased."""
    parts = urlsplit(str(url))
    scheme = (parts.scheme or "").lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme, 0)
    except ValueError:
        port = -1
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


@contextlib.contextmanager
def token_only_to(endpoint: str) -> Iterator[None]:
    """While in force (on this thread), the token goes to ``endpoint``'s origin only."""
    mark = _TOKEN_ORIGIN.set(origin(endpoint))
    try:
        yield
    finally:
        _TOKEN_ORIGIN.reset(mark)


def _token_hook(request: Any) -> None:
    allowed = _TOKEN_ORIGIN.get()
    if allowed is None or "authorization" not in request.headers:
        return
    if origin(request.url) != allowed:
        raise TokenRefused(
            f"a request to {origin(request.url)} would have carried the HF token, which "
            f"goes only to {allowed}"
        )


def _capped(iter_bytes: Callable[..., Iterator[bytes]], url: str, limit: int) -> Any:
    def capped(*args: Any, **kwargs: Any) -> Iterator[bytes]:
        seen = 0
        for chunk in iter_bytes(*args, **kwargs):
            seen += len(chunk)
            if seen > limit:
                raise BodyTooLong(f"the answer to {url} is longer than {limit:,} bytes")
            yield chunk

    return capped


def _cap_hook(response: Any) -> None:
    url = response.request.url
    is_api = url.path.startswith("/api/")
    if not (is_api or response.is_redirect):
        return
    # read() joins iter_bytes(): capping the decoded bytes also catches a gzip bomb
    response.iter_bytes = _capped(response.iter_bytes, str(url.copy_with(query=None)), MAX_BODY)


def guard_session() -> None:
    """Install the cap on huggingface_hub's current session (idempotent, cheap)."""
    from huggingface_hub import get_session

    session = get_session()
    with _lock:
        hooks = session.event_hooks
        changed = False
        if _cap_hook not in hooks.get("response", []):
            hooks["response"] = [*hooks.get("response", []), _cap_hook]
            changed = True
        if _token_hook not in hooks.get("request", []):
            hooks["request"] = [*hooks.get("request", []), _token_hook]
            changed = True
        if changed:
            session.event_hooks = hooks
