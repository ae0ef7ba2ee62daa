"""Bounds on what a server may make huggingface_hub's HTTP session read into memory.

huggingface_hub reads API answers (model info, file listings) and the bodies of
redirects whole, with no limit: a hostile server, or a broken mirror behind
``HF_ENDPOINT``, could answer with an endless or gzip-bombed body and take all
the memory there is.  :func:`guard_session` adds a response hook to the shared
session (``huggingface_hub.get_session``) that caps, as they are decoded, the
bodies of API answers and of redirects at :data:`MAX_BODY` bytes; file content
(``/resolve/`` answers, the CDN) is streamed by the transfer and bounded by the
listed size there.

Every request through that session has a connect and a read timeout
(:data:`CONNECT_TIMEOUT`, :data:`READ_TIMEOUT`), whoever made it: huggingface_hub sends
``timeout=None`` (no bound at all) for ``model_info`` and ``list_models``, so a server
that accepts a request and never answers it would hold k3desk for ever.  A request hook
gives such a request the bounds here; one that brings its own keeps them.
:func:`patient` asks again a bounded number of times after a timeout, then names the
request that got no answer (:class:`Stalled`).

It also adds a request hook that keeps the HF token on the Hub's own origin: while
:func:`token_only_to` is in force (a listing), a request carrying ``Authorization``
to any other origin is refused before it is sent, whoever built it (a pagination
link, a redirect, huggingface_hub itself).

huggingface_hub closes its shared session whenever a connection cannot be made
(``utils/_http.py``, ``_http_backoff_base``: ``close_session()`` on ``ConnectError``),
from whichever thread met it, and the next request gets a fresh one.  Two things follow,
and :func:`guard_session` handles both by making the sessions itself
(``set_client_factory``): every new session gets the hooks above at once, not only at
k3desk's next call; and closing one waits for the requests it is serving (the header
reads and range transfers of other threads).  Closed under them, its connection pool
forgets the connections they are opening, which then stay open until the collector
finds their sockets (unclosed) and nothing ever closes them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar
from urllib.parse import urlsplit

from k3desk.core.errors import HubError

MAX_BODY = 32 * 1024 * 1024  # a 1000-file repository lists in well under 1 MiB
CONNECT_TIMEOUT = 15.0  # seconds to open a connection
READ_TIMEOUT = 30.0  # seconds an answer may go without a byte (the Hub answers in < 1 s)
ATTEMPTS = 3  # a request that times out is sent this many times in all

T = TypeVar("T")

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


def _timeout_hook(request: Any) -> None:
    """Give a request sent without a connect or read bound (``timeout=None``) the bounds
    of this module (read now, so that they can be changed at run time)."""
    t = dict(request.extensions.get("timeout") or {})
    if t.get("connect") is None or t.get("read") is None:
        t["connect"] = t.get("connect") or CONNECT_TIMEOUT
        t["read"] = t.get("read") or READ_TIMEOUT
        t.setdefault("write", None)
        t.setdefault("pool", None)
        t["pool"] = t["pool"] or CONNECT_TIMEOUT
        request.extensions = {**request.extensions, "timeout": t}


class Stalled(HubError):
    """A request got no answer in time, every time it was sent."""


def timed_out(exc: BaseException) -> bool:
    """A connect, read, write or pool timeout (httpx's, or the socket's)."""
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"TimeoutException", "TimeoutError"})


def patient(call: Callable[[], T], what: str, where: str, cancel: Any = None) -> T:
    """``call()``, sent again after a timeout (:data:`ATTEMPTS` in all); the last timeout
    becomes :class:`Stalled`, naming ``what`` (the request) and ``where`` (the server).
    ``cancel`` (a CancelToken) is looked at before every attempt after the first."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call()
        except Exception as exc:
            if not timed_out(exc):
                raise
            if attempt == ATTEMPTS:
                names = {c.__name__ for c in type(exc).__mro__}
                how = f"got the request for {what} but sent no answer within {READ_TIMEOUT:g} s"
                if names & {"ConnectTimeout", "PoolTimeout"}:
                    how = f"could not be reached for {what} within {CONNECT_TIMEOUT:g} s"
                raise Stalled(
                    f"{where} {how}, {ATTEMPTS} times in a row; k3desk stopped asking.",
                    "The Hub (or the mirror or proxy in HF_ENDPOINT / HTTPS_PROXY) is stuck or "
                    "unreachable; check the network, then try again later.",
                ) from None
            if cancel is not None:
                cancel.raise_if_cancelled()
    raise AssertionError("unreachable: the last attempt returns or raises")


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


def _shared_client_class() -> type[Any]:
    """httpx2.Client whose close, asked for while requests are in flight, happens once
    the last of them is done (its response closed)."""
    global _SharedClient
    if _SharedClient is not None:
        return _SharedClient
    import httpx2

    class _Released(httpx2.SyncByteStream):
        """A response's body that tells the client when it is closed."""

        def __init__(self, inner: httpx2.SyncByteStream, done: Callable[[], None]) -> None:
            self._inner, self._done = inner, done
            self._closed = False

        def __iter__(self) -> Iterator[bytes]:
            yield from self._inner

        def close(self) -> None:
            try:
                self._inner.close()
            finally:
                if not self._closed:
                    self._closed = True
                    self._done()

    class SharedClient(httpx2.Client):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._k3_lock = threading.Lock()
            self._k3_in_flight = 0
            self._k3_close_asked = False

        def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
            with self._k3_lock:
                closed = self.is_closed
                if not closed:
                    self._k3_in_flight += 1
            if closed:  # a thread that took this session before it was closed
                from huggingface_hub import get_session

                current = get_session()
                if current is not self:
                    return current.send(request, **kwargs)
                return super().send(request, **kwargs)  # (closed: it says so)
            try:
                response = super().send(request, **kwargs)
            except BaseException:
                self._k3_done()
                raise
            if response.is_closed:  # read whole (stream=False): its connection is back
                self._k3_done()
            else:
                assert isinstance(response.stream, httpx2.SyncByteStream)
                response.stream = _Released(response.stream, self._k3_done)
            return response

        def close(self) -> None:
            with self._k3_lock:
                if self._k3_in_flight:
                    self._k3_close_asked = True  # closed by the last request done
                    return
            super().close()

        def _k3_done(self) -> None:
            with self._k3_lock:
                self._k3_in_flight -= 1
                close = self._k3_close_asked and not self._k3_in_flight
            if close:
                super().close()

    _SharedClient = SharedClient
    return SharedClient


_SharedClient: type[Any] | None = None


def _guarded_client() -> Any:
    """huggingface_hub's session as its ``default_client_factory`` makes it, with the
    hooks of this module, and a close that waits for the requests in flight."""
    from huggingface_hub.utils._http import hf_request_event_hook

    return _shared_client_class()(
        event_hooks={
            "request": [hf_request_event_hook, _timeout_hook, _token_hook],
            "response": [_cap_hook],
        },
        follow_redirects=True,
        timeout=None,
    )


def guard_session() -> None:
    """Install the cap, the timeouts and the token rule on huggingface_hub's sessions, the current
    one and those made after it (idempotent, cheap)."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import _http

    with _lock:
        if _http._GLOBAL_CLIENT_FACTORY is not _guarded_client:
            _http.set_client_factory(_guarded_client)
    session = get_session()
    with _lock:
        hooks = session.event_hooks
        changed = False
        if _cap_hook not in hooks.get("response", []):
            hooks["response"] = [*hooks.get("response", []), _cap_hook]
            changed = True
        for hook in (_timeout_hook, _token_hook):
            if hook not in hooks.get("request", []):
                hooks["request"] = [*hooks.get("request", []), hook]
                changed = True
        if changed:
            session.event_hooks = hooks
