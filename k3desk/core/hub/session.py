"""Bounds on what a server may make huggingface_hub's HTTP session read into memory.

huggingface_hub reads API answers (model info, file listings) and the bodies of
redirects whole, with no limit: a hostile server, or a broken mirror behind
``HF_ENDPOINT``, could answer with an endless or gzip-bombed body and take all
the memory there is.  :func:`guard_session` adds a response hook to the shared
session (``huggingface_hub.get_session``) that caps, as they are decoded, the
bodies of API answers and of redirects at :data:`MAX_BODY` bytes; file content
(``/resolve/`` answers, the CDN) is streamed by the transfer and bounded by the
listed size there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

MAX_BODY = 32 * 1024 * 1024  # a 1000-file repository lists in well under 1 MiB

_lock = threading.Lock()


class BodyTooLong(Exception):
    """A server sent more than it may (an API answer over MAX_BODY, a file over its size)."""


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
        if _cap_hook not in hooks.get("response", []):
            hooks["response"] = [*hooks.get("response", []), _cap_hook]
            session.event_hooks = hooks
