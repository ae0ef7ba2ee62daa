"""A streaming client for OpenAI-compatible ``/v1/chat/completions`` servers.

It talks to the llama-server k3desk starts and to any remote OpenAI-compatible URL
(vLLM, a SparkInfer bridge, a hosted API), each in its own dialect: the first request
finds out what the server is (:meth:`ChatClient.capabilities`, unless the endpoint says),
and every request is then built the way that server reads it
(:mod:`k3desk.core.chat.dialects`).  Answers stream as server-sent events; content and
reasoning deltas are delivered as they arrive, through an iterator
(:meth:`ChatClient.stream`) or callbacks (:meth:`ChatClient.chat`).  K3 channel markers a
server hands through are taken out (:mod:`k3desk.core.chat.channels`), and where a server
reports no usage or timings the client measures them (marked ``by_client``/``estimated``).

Cancelling (a :class:`CancelToken`, from any thread) shuts the socket down, which
wakes the reading thread at once and tells llama-server to stop generating.
Failures are :class:`ChatError` subclasses with messages a person can act on; a
stream cut in the middle keeps the partial answer in the error's ``result``.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Literal

import httpx

from k3desk.core.chat import dialects, wire
from k3desk.core.chat.channels import ChannelSplitter, StopCutter
from k3desk.core.chat.dialects import Limits, ServerInfo
from k3desk.core.chat.images import PreparedImage, ensure_vision
from k3desk.core.chat.model import ChatSettings, Role, Timings, Usage
from k3desk.core.errors import Cancelled, ChatError
from k3desk.core.progress import CancelToken
from k3desk.core.safepaths import scrub

THINKING_EFFORTS = ("low", "high", "max")  # what the Kimi-K3 chat template accepts


# ------------------------------------------------------------------ errors


class EngineUnavailableError(ChatError):
    """The server cannot be reached, is loading, or is restarting."""


class AuthError(ChatError):
    """The server refused the API key (or wanted one)."""


class ClientClosed(ChatError):
    """The client was closed (by another thread) while a request was on its way."""


class UndescribedError(ChatError):
    """The server answers but does not say what it is or serves (no /props, no models)."""


class ContextOverflowError(ChatError):
    """The conversation does not fit in the engine's context window."""

    def __init__(
        self, message: str, hint: str = "", n_prompt: int | None = None, n_ctx: int | None = None
    ) -> None:
        super().__init__(message, hint)
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class ChatStreamError(ChatError):
    """The answer stopped before it was complete; ``result`` holds what arrived."""

    def __init__(self, message: str, hint: str, result: ChatResult) -> None:
        super().__init__(message, hint)
        self.result = result


# ------------------------------------------------------------------ data


@dataclass(frozen=True)
class ChatEndpoint:
    """Where to send chat requests: a base URL (with or without ``/v1``) and a key."""

    base_url: str
    api_key: str | None = None
    model: str | None = None  # sent as "model"; None = ask the server once
    # the server's kind (dialects.DIALECT_IDS); None = find out on first use
    dialect: str | None = None
    limits: Limits | None = None  # what the user says the server allows (None: find out)
    # the local engine process k3desk started: the key goes to it alone (checked before
    # every request, k3desk.core.engines.identity.owner_problem); None for an attached URL
    owner_pid: int | None = None

    @property
    def root(self) -> str:
        url = self.base_url.strip().rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        return url

    def url(self, path: str) -> str:
        return f"{self.root}{path}"

    def headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def check_url(url: str) -> None:
    """Raise :class:`ChatError` unless ``url`` is an http(s) URL with a host."""
    hint = "Give the server's address, for example http://127.0.0.1:8080."
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise ChatError(f"{url!r} is not a URL k3desk can use ({exc}).", hint) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ChatError(
            f"{url!r} is not a URL k3desk can use: it needs http:// or https:// and a host.",
            hint,
        )


GENERIC = ServerInfo("openai")


@dataclass(frozen=True)
class Capabilities:
    """What the server says about itself (``/props``, else ``/v1/models``)."""

    vision: bool | None  # None: the server does not say
    n_ctx: int | None
    model: str | None
    source: Literal["props", "models", "healthz"]
    server: ServerInfo = GENERIC


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str
    images: tuple[PreparedImage, ...] = ()

    def to_openai(self) -> dict[str, Any]:
        # undecodable bytes (lone surrogates) cannot go into a UTF-8 request body
        content = scrub(self.content)
        if not self.images:
            return {"role": self.role, "content": content}
        parts: list[dict[str, Any]] = [img.content_part() for img in self.images]
        if content:
            parts.append({"type": "text", "text": content})
        return {"role": self.role, "content": parts}


@dataclass(frozen=True)
class ChatDelta:
    kind: Literal["content", "reasoning"]
    text: str


@dataclass(frozen=True)
class ChatResult:
    text: str
    reasoning: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    model: str | None = None
    partial: bool = False  # the answer stopped before the engine finished it
    cancelled: bool = False  # ... because the caller cancelled
    elapsed_s: float = 0.0
    first_token_s: float | None = None  # time to the first content or reasoning delta

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "reasoning": self.reasoning,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict() if self.usage else None,
            "timings": self.timings.to_dict() if self.timings else None,
            "model": self.model,
            "partial": self.partial,
            "cancelled": self.cancelled,
            "elapsed_s": round(self.elapsed_s, 4),
            "first_token_s": None if self.first_token_s is None else round(self.first_token_s, 4),
        }


DeltaCallback = Callable[[ChatDelta], None]


# ------------------------------------------------------------------ client


def _socket_of(event: str, info: Mapping[str, Any]) -> socket.socket | None:
    """The socket an httpx request connected (its trace's ``connect_tcp`` event)."""
    if event != "connection.connect_tcp.complete":
        return None
    stream = info.get("return_value")
    sock = stream.get_extra_info("socket") if stream is not None else None
    return sock if isinstance(sock, socket.socket) else None


def _shut(sock: socket.socket) -> None:
    # shutdown() (unlike close()) wakes a thread blocked in recv() on this socket
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _HeldSocket:
    """The connection of one request, shut down once ``cancel`` is cancelled (at once
    when it already is, or as soon as it connects).  llama-server drops a request whose
    connection closed: it polls for that while the request waits for its result
    (tools/server: ``wait_for_all(req.should_stop)``, every ``HTTP_POLLING_SECONDS``)."""

    def __init__(self, cancel: CancelToken) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.aborted = False
        cancel.on_cancel(self._abort)

    def trace(self, event: str, info: Mapping[str, Any]) -> None:
        sock = _socket_of(event, info)
        if sock is None:
            return
        with self._lock:
            self._sock = sock
            aborted = self.aborted
        if aborted:
            _shut(sock)

    def _abort(self) -> None:
        with self._lock:
            self.aborted = True
            sock = self._sock
        if sock is not None:
            _shut(sock)


DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=60.0, pool=10.0)
# llama-server sends nothing until the prompt is read, which for a long conversation
# on a big MoE partly in RAM can take many minutes: no read limit on answers by
# default (cancelling still ends them at once).
DEFAULT_ANSWER_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=60.0, pool=10.0)
ACCEPTED = "gzip, deflate"  # the encodings k3desk.core.chat.wire decodes


class ChatClient:
    """One endpoint's chat client.  Thread-safe; close it (or use ``with``) when done."""

    def __init__(
        self,
        endpoint: ChatEndpoint,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        answer_timeout: httpx.Timeout | float = DEFAULT_ANSWER_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        check_url(endpoint.root)
        self.endpoint = endpoint
        self.answer_timeout = answer_timeout
        # No keep-alive: every request gets its own connection, so cancelling one
        # can shut that socket down without touching another request's.  The
        # "Connection: close" makes each connection close itself after its answer, even
        # when close() dropped the pool while that request was still connecting (the
        # pool then no longer knows the connection and would leave its socket open).
        self._http = httpx.Client(
            timeout=timeout,
            transport=transport,
            limits=httpx.Limits(max_keepalive_connections=0),
            # bodies are decoded by k3desk.core.chat.wire, which reads gzip and deflate
            headers={**endpoint.headers(), "Connection": "close", "Accept-Encoding": ACCEPTED},
        )
        self._caps: Capabilities | None = None
        self._undescribed = False  # asked once, and it would not say: the common form
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client (from any thread): a request on its way on another thread
        ends with :class:`ClientClosed`, a stream as cancelled."""
        self._closed = True
        self._http.close()

    def is_closed(self) -> bool:
        return self._closed

    def closed_error(self) -> ChatError:
        return ClientClosed(
            f"The chat client for {self.endpoint.root} was closed while a request was on "
            "its way (the chat window closed).",
            "Send it again once the chat is open.",
        )

    # ---------------------------------------------------------- capabilities

    def capabilities(self, *, refresh: bool = False) -> Capabilities:
        """What the server can do (vision, context size, model id); cached."""
        with self._lock:
            if self._caps is not None and not refresh:
                return self._caps
        caps = self._probe()
        with self._lock:
            self._caps = caps
        return caps

    def cached_capabilities(self) -> Capabilities | None:
        """What is already known (no request)."""
        with self._lock:
            return self._caps

    def server(self) -> ServerInfo:
        """What the server is and allows (found once; see :meth:`capabilities`)."""
        return self.capabilities().server

    def _probe(self) -> Capabilities:
        try:
            return self._describe()
        except (AttributeError, TypeError, ValueError, KeyError, OverflowError) as exc:
            # a field of the wrong JSON type (a list for a dict, text for a number)
            raise UndescribedError(
                f"{self.endpoint.root} described itself with something k3desk cannot read "
                f"({type(exc).__name__}: {str(exc)[:200]}).",
                "Check that the URL points at an OpenAI-compatible server "
                "(llama-server, vLLM, ...).",
            ) from None

    def _describe(self) -> Capabilities:
        ep = self.endpoint
        props = self._get_json("/props")
        info = dialects.from_props(props)
        if info is not None:
            modalities = props.get("modalities") or {}
            model = props.get("model_alias") or None
            if not model and props.get("model_path"):
                model = str(props["model_path"]).replace("\\", "/").rsplit("/", 1)[-1]
            vision = modalities.get("vision") if isinstance(modalities, dict) else None
            return self._finish(
                Capabilities(
                    vision=None if vision is None else bool(vision),
                    n_ctx=info.limits.context,
                    model=model,
                    source="props",
                    server=info,
                )
            )
        _status, health = self._get("/healthz")
        if dialects.is_bridge_health(health):
            ready_status, ready = self._get("/readyz")
            bridge = dialects.from_bridge(health, ready_status, ready)
            assert bridge is not None
            return self._finish(
                Capabilities(
                    vision=False,  # server.py: "only text message content is supported"
                    n_ctx=bridge.limits.context,
                    model=ep.model or str(health["model"]),
                    source="healthz",
                    server=bridge,
                )
            )
        _status, version = self._get("/version")
        models = self._get_json("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise UndescribedError(
                f"{ep.root} did not describe itself: neither /props nor /v1/models answered "
                "with a model.",
                "Check that the URL points at an OpenAI-compatible server "
                "(llama-server, vLLM, ...).",
            )
        first: dict[str, Any] = data[0]
        if ep.model:
            named = [m for m in data if isinstance(m, dict) and m.get("id") == ep.model]
            first = named[0] if named else first
        n_ctx_raw = (
            (first.get("meta") or {}).get("n_ctx")
            or first.get("max_model_len")
            or first.get("context_length")
        )
        arch = first.get("architecture")
        vision_m: bool | None = None
        if isinstance(arch, dict) and isinstance(arch.get("input_modalities"), list):
            vision_m = "image" in arch["input_modalities"]
        n_ctx = int(n_ctx_raw) if isinstance(n_ctx_raw, int) and n_ctx_raw > 0 else None
        info = dialects.from_version(version) or dialects.from_models(models)
        if n_ctx is not None:
            info = replace(info, limits=Limits(context=n_ctx, source="/v1/models"))
        return self._finish(
            Capabilities(
                vision=vision_m,
                n_ctx=n_ctx,
                model=str(first["id"]) if first.get("id") is not None else None,
                source="models",
                server=info,
            )
        )

    def _finish(self, caps: Capabilities) -> Capabilities:
        """Apply what the endpoint says (the user's kind and limits) and learn the bridge's."""
        ep = self.endpoint
        info = caps.server
        if ep.dialect and ep.dialect != info.dialect:
            kind = dialects.dialect(ep.dialect)
            base = kind.fixed_limits if kind.fixed_limits is not None else info.limits
            info = ServerInfo(
                kind.id,
                detail=f"k3desk found {info.kind.label}",
                limits=base,
                overridden=True,
            )
        elif ep.dialect:
            info = replace(info, overridden=True)
        told = ep.limits
        if info.kind.probe_limits and (told is None or told.max_tokens is None):
            info = self._learn_bridge_limits(info, caps.model)
        if told is not None:
            lim = info.limits
            info = replace(
                info,
                limits=Limits(
                    told.max_tokens if told.max_tokens is not None else lim.max_tokens,
                    told.default_max_tokens
                    if told.default_max_tokens is not None
                    else lim.default_max_tokens,
                    told.context if told.context is not None else lim.context,
                    told.source or "set by you",
                ),
            )
        n_ctx = info.limits.context if info.limits.context is not None else caps.n_ctx
        vision = False if info.kind.images is False else caps.vision
        return replace(caps, server=info, n_ctx=n_ctx, vision=vision)

    def _learn_bridge_limits(self, info: ServerInfo, model: str | None) -> ServerInfo:
        """Ask the bridge for more tokens than any limit: its refusal names K3_MAX_TOKENS.

        server.py validates before it reaches the engine (validate_request), so nothing is
        generated; a bridge that cannot render prompts says so here too.
        """
        body = {
            "model": model or dialects.BRIDGE_MODEL,
            "messages": [{"role": "user", "content": "k3desk limit check"}],
            "max_tokens": dialects.LIMIT_PROBE_TOKENS,
            "stream": False,
        }
        path = "/v1/chat/completions"
        status, content = self._fetch("POST", path, body)
        if status in (401, 403):
            raise _status_error(self.endpoint, status, content, path)
        try:
            parsed = json.loads(content)
        except ValueError:
            return info
        err = parsed.get("error") if isinstance(parsed, dict) else None
        if not err:
            return info
        msg, _etype = _error_text(err)
        code = str(err.get("code") or "") if isinstance(err, dict) else ""
        limits, problem = dialects.learn_bridge_limits(info.limits, status, (msg, code))
        return replace(info, limits=limits, problem=problem or info.problem)

    def check_owner(self) -> None:
        """Raise :class:`EngineUnavailableError` when the endpoint is a local engine k3desk
        started and its port is not (or no longer) held by that process: the key is not
        sent to whatever took the port."""
        ep = self.endpoint
        if ep.owner_pid is None or not ep.api_key:
            return
        from k3desk.core.engines.identity import owner_problem

        port = httpx.URL(ep.root).port
        problem = owner_problem(ep.owner_pid, port or 80)
        if problem:
            raise EngineUnavailableError(
                f"Not sending the request to {ep.root}: {problem}.",
                "The engine may have crashed or been restarted on another port; wait until "
                "it is ready again, then send again.",
            )

    def _fetch(
        self,
        method: str,
        path: str,
        body: Any = None,
        limit: int = wire.MAX_DESCRIPTION,
        slow: bool = False,
        cancel: CancelToken | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) of one request, the body read up to ``limit`` decoded bytes (an
        error's body: its first :data:`wire.MAX_ERROR_BODY` bytes); raises ChatError when
        the server cannot be reached or sends more.  ``slow``: the engine answers only once
        it has done the work (read a prompt, wrote or read a state), so it is waited for as
        an answer is, with no limit on the read.  ``cancel``: cancelling it ends the
        request at once (its connection shut down, which the engine takes as the request
        withdrawn) with :class:`~k3desk.core.errors.Cancelled`."""
        ep = self.endpoint
        self.check_owner()
        if self.is_closed():
            raise self.closed_error()
        held = _HeldSocket(cancel) if cancel is not None else None
        if held is not None and held.aborted:
            raise Cancelled()
        wait = self.answer_timeout if slow else self._http.timeout
        trace = {"trace": held.trace} if held is not None else None
        try:
            with self._http.stream(
                method, ep.url(path), json=body, timeout=wait, extensions=trace
            ) as resp:
                if resp.status_code >= 400:
                    what = f"the error answer to {path}"
                    content = wire.read_capped(resp, wire.MAX_ERROR_BODY, what, truncate=True)
                else:
                    content = wire.read_capped(resp, limit, f"the answer to {path}")
                return resp.status_code, content
        except httpx.TransportError as exc:
            if held is not None and held.aborted:
                raise Cancelled() from None
            raise _transport_error(ep, exc, before_answer=True) from None
        except RuntimeError:
            # httpx: "Cannot send a request, as the client has been closed" (closed by
            # another thread after the check above)
            if self.is_closed():
                raise self.closed_error() from None
            raise
        except (wire.TooLong, wire.UnknownEncoding) as exc:
            raise ChatError(
                f"The server at {ep.root} answered {path} with more than k3desk reads: {exc}.",
                "Check that the URL points at an OpenAI-compatible server.",
            ) from None

    def _get(self, path: str) -> tuple[int, Any]:
        """(status, parsed JSON or None); raises only when the server cannot be reached."""
        status, content = self._fetch("GET", path)
        try:
            return status, json.loads(content)
        except ValueError:
            return status, None

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        slow: bool = False,
        cancel: CancelToken | None = None,
    ) -> tuple[int, Any]:
        """(status, parsed JSON or None) of one request to the engine (its own endpoints:
        /apply-template, /completion, /slots), with the client's key and owner check;
        raises :class:`ChatError` only when the server cannot be reached.  ``slow``: work
        whose time grows with the prompt or the machine (reading a prompt, saving or
        restoring a slot), waited for with no read limit, as an answer is.  ``cancel``:
        ends it at once when cancelled (:class:`~k3desk.core.errors.Cancelled`)."""
        status, content = self._fetch(method, path, body, slow=slow, cancel=cancel)
        try:
            return status, json.loads(content)
        except ValueError:
            return status, None

    def _get_json(self, path: str) -> Any:
        status, content = self._fetch("GET", path)
        if status in (401, 403, 503):
            raise _status_error(self.endpoint, status, content, path)
        if status != 200:
            return None
        try:
            return json.loads(content)
        except ValueError:
            return None

    # ---------------------------------------------------------- chat

    def known_server(self) -> ServerInfo:
        """What is known of the server without asking it (the endpoint's word, else generic)."""
        with self._lock:
            caps = self._caps
        if caps is not None:
            return caps.server
        ep = self.endpoint
        if ep.dialect:
            kind = dialects.dialect(ep.dialect)
            limits = ep.limits or kind.fixed_limits or Limits()
            return ServerInfo(kind.id, limits=limits, overridden=True)
        return ServerInfo("openai")

    def build_body(
        self, messages: Sequence[ChatMessage], settings: ChatSettings | None = None
    ) -> dict[str, Any]:
        """The JSON request for ``messages``, in the server's dialect.

        Validates the settings first, and raises :class:`ChatError` for a request the
        server is known to refuse (a limit it has), before anything is sent.
        """
        s = settings or ChatSettings()
        if s.thinking_effort is not None and s.thinking_effort not in THINKING_EFFORTS:
            raise ChatError(
                f"Unknown thinking effort {s.thinking_effort!r}.",
                f"Use one of: {', '.join(THINKING_EFFORTS)}.",
            )
        if s.max_tokens is not None and s.max_tokens < 1:
            raise ChatError(
                f"Max tokens must be at least 1, not {s.max_tokens}.",
                "Leave it empty for as much as the server allows.",
            )
        if not messages:
            raise ChatError("There is no message to send.")
        info = self.known_server()
        wire = [m.to_openai() for m in messages]
        dialects.check_request(info, wire, s)
        model = self.endpoint.model
        if model is None and self._caps is not None:
            model = self._caps.model
        if model is None:
            model = info.kind.model_name  # the bridge refuses any other name
        body = dialects.request_body(info, wire, s, model)
        if info.dialect == "llama-server" and self.endpoint.owner_pid is not None:
            # k3desk's own engine: the chat's turns go to slot 0, where its conversation's
            # state is restored and kept (kept_state), whatever else the engine answers at
            # once (--parallel above 1: the local API's tools); unpinned, the engine could
            # read it again in another slot while its state waits in slot 0
            # (get_available_slot, tools/server/server-context.cpp)
            body.setdefault("id_slot", 0)
        return body

    def stream(
        self,
        messages: Sequence[ChatMessage],
        settings: ChatSettings | None = None,
        cancel: CancelToken | None = None,
    ) -> ChatStream:
        """Send ``messages`` and return an iterator over the answer's deltas.

        Raises (before any delta) when the request is refused; iterating raises
        :class:`ChatStreamError` if the stream breaks, with the partial result.
        After iteration ``stream.result`` holds the :class:`ChatResult`.
        """
        if any(m.images for m in messages):
            caps = self.capabilities()
            ensure_vision(caps.vision, where=self.endpoint.root)
        elif self._caps is None and not self._undescribed:
            # the server's kind decides the request's form; a server that does not answer
            # these questions gets the common one (and the request says what is wrong)
            try:
                self.capabilities()
            except UndescribedError:
                self._undescribed = True  # not asked again by this client
            except ChatError:
                pass
        s = settings or ChatSettings()
        body = self.build_body(messages, s)
        info = self.known_server()
        return ChatStream(
            self,
            body,
            cancel,
            stop=s.stop if info.kind.stop == "client" else (),
            prompt_estimate=dialects.estimate_prompt(body["messages"]),
            max_pieces=s.max_tokens,
        )

    def chat(
        self,
        messages: Sequence[ChatMessage],
        settings: ChatSettings | None = None,
        *,
        on_delta: DeltaCallback | None = None,
        cancel: CancelToken | None = None,
    ) -> ChatResult:
        """Send ``messages``, call ``on_delta`` for each delta, return the result.

        A cancelled request returns a result with ``cancelled`` and ``partial`` set.
        """
        with self.stream(messages, settings, cancel) as st:
            for delta in st:
                if on_delta is not None:
                    on_delta(delta)
        assert st.result is not None
        return st.result


class ChatStream:
    """One streaming answer.  Iterate it for :class:`ChatDelta`; then read ``result``."""

    def __init__(
        self,
        client: ChatClient,
        body: Mapping[str, Any],
        cancel: CancelToken | None,
        *,
        stop: tuple[str, ...] = (),
        prompt_estimate: int | None = None,
        max_pieces: int | None = None,
    ) -> None:
        self._client = client
        # --max-tokens held here too: a server that goes on past it is hung up on
        self._max_pieces = max_pieces
        self._events = 0
        self._chars = 0
        self._body = body
        self._cancel = cancel or CancelToken()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._response: httpx.Response | None = None
        self._aborted = False
        self._finished = False
        self._started = False
        self.result: ChatResult | None = None
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._finish_reason: str | None = None
        self._usage: Usage | None = None
        self._timings: Timings | None = None
        self._model: str | None = None
        self._t0 = 0.0
        self._t_first: float | None = None
        # K3 markers a server hands through; stop sequences the server does not take
        self._splitter = ChannelSplitter()
        self._cutter = StopCutter(stop) if stop else None
        self._stopped_here = False  # the answer reached a stop sequence (cut by k3desk)
        # what the client measures, for servers that report no usage or timings
        self._prompt_estimate = prompt_estimate
        self._pieces = 0
        self._t_piece0: float | None = None
        self._t_piece1: float | None = None

    def __enter__(self) -> ChatStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def cancel(self) -> None:
        """Stop the answer (from any thread); iteration then ends with a cancelled result."""
        self._cancel.cancel()

    def close(self) -> None:
        """Drop the connection if the answer is still streaming."""
        if not self._finished:
            self._abort()
            if self.result is None and self._started:
                self.result = self._snapshot(partial=True, cancelled=True)
        resp = self._response
        if resp is not None:
            with contextlib.suppress(httpx.HTTPError, OSError):
                resp.close()

    # ---------------------------------------------------------- internals

    def _trace(self, event: str, info: Mapping[str, Any]) -> None:
        sock = _socket_of(event, info)
        if sock is not None:
            with self._lock:
                self._sock = sock
                aborted = self._aborted
            if aborted:
                self._shutdown(sock)

    def _abort(self) -> None:
        with self._lock:
            if self._aborted or self._finished:
                return
            self._aborted = True
            sock = self._sock
        if sock is not None:
            self._shutdown(sock)
        elif self._response is not None:
            with contextlib.suppress(httpx.HTTPError, OSError):
                self._response.close()

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        _shut(sock)

    def _snapshot(self, *, partial: bool, cancelled: bool = False) -> ChatResult:
        return ChatResult(
            text="".join(self._text),
            reasoning="".join(self._reasoning),
            finish_reason=self._finish_reason,
            usage=self._usage or self._measured_usage(),
            timings=self._timings or self._measured_timings(),
            model=self._model,
            partial=partial,
            cancelled=cancelled,
            elapsed_s=time.monotonic() - self._t0,
            first_token_s=None if self._t_first is None else self._t_first - self._t0,
        )

    def _open(self) -> httpx.Response:
        client = self._client
        ep = client.endpoint
        self._t0 = time.monotonic()
        request = client._http.build_request(
            "POST",
            ep.url("/v1/chat/completions"),
            json=self._body,
            # decoded here, bounded (k3desk.core.chat.wire): no decompression by httpx
            headers={"Accept": "text/event-stream", "Accept-Encoding": ACCEPTED},
            timeout=client.answer_timeout,
            extensions={"trace": self._trace},
        )
        self._cancel.on_cancel(self._abort)
        client.check_owner()
        if self._cancel.cancelled or client.is_closed():
            self._finished = True
            self.result = self._snapshot(partial=True, cancelled=True)
            raise _Cancelled
        try:
            resp = client._http.send(request, stream=True)
        except httpx.TransportError as exc:
            if self._aborted:
                self._finished = True
                self.result = self._snapshot(partial=True, cancelled=True)
                raise _Cancelled from None
            raise _transport_error(ep, exc, before_answer=True) from None
        except RuntimeError:
            if not client.is_closed():
                raise
            # the client closed after the check above (its window closed): as a stop
            self._finished = True
            self.result = self._snapshot(partial=True, cancelled=True)
            raise _Cancelled from None
        self._response = resp
        if resp.status_code != 200:
            try:
                what = "the error answer to /v1/chat/completions"
                content = wire.read_capped(resp, wire.MAX_ERROR_BODY, what, truncate=True)
            except httpx.HTTPError:
                content = b""
            finally:
                resp.close()
            self._finished = True
            raise _status_error(ep, resp.status_code, content, "/v1/chat/completions")
        return resp

    def __iter__(self) -> Iterator[ChatDelta]:
        if self._started:
            raise RuntimeError("a ChatStream can be iterated only once")
        self._started = True
        try:
            resp = self._open()
        except _Cancelled:
            return
        try:
            yield from self._read(resp)
        finally:
            with self._lock:
                self._finished = True
            with contextlib.suppress(httpx.HTTPError, OSError):
                resp.close()

    def _measured_timings(self) -> Timings | None:
        """Generation speed from when the answer's pieces arrived (a piece is about a token)."""
        t0, t1, n = self._t_piece0, self._t_piece1, self._pieces
        if t0 is None or t1 is None or n < 2 or t1 <= t0:
            return None
        return Timings(
            prompt_n=self._prompt_estimate or 0,
            prompt_ms=(t0 - self._t0) * 1000.0,
            predicted_n=n,
            predicted_ms=(t1 - t0) * 1000.0,
            predicted_per_second=(n - 1) / (t1 - t0),
            by_client=True,
        )

    def _measured_usage(self) -> Usage | None:
        if not self._pieces:
            return None
        prompt = self._prompt_estimate or 0
        return Usage(prompt, self._pieces, prompt + self._pieces, estimated=True)

    def _take(self, pieces: list[tuple[Literal["content", "reasoning"], str]]) -> list[ChatDelta]:
        out: list[ChatDelta] = []
        moved = self._splitter.moved_to_reasoning
        if moved:
            # the first marker was a closing </think>: the "content" so far was reasoning
            self._splitter.moved_to_reasoning = 0
            text = "".join(self._text)
            self._text = [text[moved:]] if len(text) > moved else []
            self._reasoning.insert(0, text[:moved])
        for kind, text in pieces:
            if kind == "content" and self._cutter is not None:
                text = self._cutter.feed(text)
                if self._cutter.stopped and not self._stopped_here:
                    self._stopped_here = True
                    self._finish_reason = "stop"
            if not text:
                continue
            (self._text if kind == "content" else self._reasoning).append(text)
            out.append(ChatDelta(kind, text))
        if out and self._t_first is None:
            self._t_first = time.monotonic()
        return out

    def _drain(self) -> list[ChatDelta]:
        """What the splitter and the stop cutter still hold, at the end of the answer."""
        out = self._take(self._splitter.flush())
        if self._cutter is not None and not self._cutter.stopped:
            rest = self._cutter.flush()
            if rest:
                self._text.append(rest)
                out.append(ChatDelta("content", rest))
        return out

    def _read(self, resp: httpx.Response) -> Iterator[ChatDelta]:
        ep = self._client.endpoint
        done = False
        try:
            for payload in self._payloads(resp):
                if payload == "[DONE]":
                    done = True
                    continue
                deltas = self._handle(payload)
                if deltas:
                    yield from deltas
                if self._stopped_here:
                    break  # k3desk cut the answer at a stop sequence: hang up
        except (wire.TooLong, wire.UnknownEncoding) as exc:
            self._abort()
            result = self._snapshot(partial=True)
            raise ChatStreamError(
                _cut_message(ep, result, f"k3desk stopped reading: {exc}"),
                "The server does not answer as an OpenAI-compatible server does; the partial "
                "answer is kept. Check the URL and the server.",
                result,
            ) from None
        except httpx.TransportError as exc:
            if self._aborted:
                self.result = self._snapshot(partial=True, cancelled=True)
                return
            yield from self._drain()
            result = self._snapshot(partial=True)
            raise ChatStreamError(
                _cut_message(ep, result, str(exc) or type(exc).__name__),
                "The engine may have crashed or been stopped; the partial answer is kept. "
                "Check the engine log, then retry.",
                result,
            ) from None
        yield from self._finish(done)

    def _payloads(self, resp: httpx.Response) -> Iterator[str]:
        """The data of each server-sent event, "[DONE]" included; after it the stream is
        read to the end (so the connection closes cleanly) and dropped.  An event not
        ended by a blank line when the stream ends comes last."""
        data_lines: list[str] = []
        pending = 0  # characters in data_lines
        done = False
        for line in wire.iter_lines(resp, "the answer stream"):
            if done:
                continue
            if line:
                if line.startswith("data:"):
                    data_lines.append(line[6:] if line.startswith("data: ") else line[5:])
                elif line.startswith("error:"):
                    data_lines.append(json.dumps({"error": _loads(line[6:].strip())}))
                else:
                    continue  # comments (":" pings), "event:", "id:", "retry:"
                pending += len(data_lines[-1])
                if pending > wire.MAX_LINE:
                    raise wire.TooLong(
                        f"one event of the answer stream is longer than {wire.MAX_LINE:,} bytes"
                    )
                continue
            if not data_lines:
                continue
            payload = data_lines[0] if len(data_lines) == 1 else "\n".join(data_lines)
            data_lines.clear()
            pending = 0
            self._events += 1
            if self._events > wire.MAX_EVENTS:
                raise wire.TooLong(f"the answer has more than {wire.MAX_EVENTS:,} events")
            done = payload == "[DONE]"
            yield payload
        if data_lines and not done:
            yield "\n".join(data_lines)

    def _finish(self, done: bool) -> Iterator[ChatDelta]:
        """After the stream: what is held back, and the result (or why it is partial)."""
        if self._aborted:
            self.result = self._snapshot(partial=True, cancelled=True)
            return
        yield from self._drain()
        if self._stopped_here:
            self.result = self._snapshot(partial=False)
            return
        if not done and self._finish_reason is None:
            result = self._snapshot(partial=True)
            raise ChatStreamError(
                _cut_message(
                    self._client.endpoint, result, "the stream ended without a final message"
                ),
                "The engine may have crashed or been stopped; the partial answer is kept. "
                "Check the engine log, then retry.",
                result,
            )
        self.result = self._snapshot(partial=False)

    def _handle(self, payload: str) -> list[ChatDelta]:
        """Record one event's data; return its deltas (usually one, often none)."""
        try:
            obj = json.loads(payload)
        except (ValueError, RecursionError):
            return []
        if not isinstance(obj, dict):
            return []
        try:
            return self._event(obj)
        except (AttributeError, TypeError, ValueError, KeyError, OverflowError) as exc:
            # a field of the wrong JSON type: say so, keep what arrived
            self._abort()
            result = self._snapshot(partial=True)
            raise ChatStreamError(
                f"The server at {self._client.endpoint.root} sent an event k3desk cannot "
                f"read ({type(exc).__name__}: {str(exc)[:200]}).",
                "The server does not answer as an OpenAI-compatible server does; the partial "
                "answer is kept.",
                result,
            ) from None

    def _event(self, obj: dict[str, Any]) -> list[ChatDelta]:
        out: list[ChatDelta] = []
        err = obj.get("error")
        if err:
            result = self._snapshot(partial=True)
            msg, etype = _error_text(err)
            if etype == "exceed_context_size_error" or _is_context_overflow(msg):
                raise _overflow(self._client.endpoint, msg)
            raise ChatStreamError(
                f"The engine reported an error in the middle of the answer: {msg}",
                "The partial answer is kept. Retry, or check the engine log.",
                result,
            )
        choices = obj.get("choices") or ()
        if not isinstance(choices, list | tuple):
            raise TypeError(f"'choices' is {type(choices).__name__}, not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise TypeError(f"a choice is {type(choice).__name__}, not an object")
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta and not isinstance(delta, dict):
                raise TypeError(f"'delta' is {type(delta).__name__}, not an object")
            if delta:
                r = delta.get("reasoning_content") or delta.get("reasoning")
                c = delta.get("content")
                for name, v in (("content", c), ("reasoning", r)):
                    if v is not None and not isinstance(v, str):
                        raise TypeError(f"'{name}' is {type(v).__name__}, not text")
                if (r or c) and not self._stopped_here:
                    if self._max_pieces is not None and self._pieces >= self._max_pieces:
                        # past --max-tokens: the answer ends here, as the server should
                        # have ended it
                        self._stopped_here = True
                        self._finish_reason = "length"
                        return out
                    self._chars += len(r or "") + len(c or "")
                    if self._chars > wire.MAX_ANSWER_CHARS:
                        raise wire.TooLong(
                            f"the answer is longer than {wire.MAX_ANSWER_CHARS:,} characters"
                        )
                    now = time.monotonic()
                    self._pieces += 1
                    self._t_piece1 = now
                    if self._t_piece0 is None:
                        self._t_piece0 = now
                plain = isinstance(c, str) and c and not r and self._cutter is None
                if plain and isinstance(c, str) and self._splitter.plain(c):
                    # the common case: content from a server that parsed K3's format itself
                    self._text.append(c)
                    out.append(ChatDelta("content", c))
                    if self._t_first is None:
                        self._t_first = time.monotonic()
                else:
                    pieces = []
                    if r and isinstance(r, str):
                        pieces += self._splitter.feed(r, "reasoning")
                    if c and isinstance(c, str):
                        pieces += self._splitter.feed(c, "content")
                    out += self._take(pieces)
            fr = choice.get("finish_reason")
            if fr and not isinstance(fr, str):
                raise TypeError(f"'finish_reason' is {type(fr).__name__}, not text")
            if fr and not self._stopped_here:
                self._finish_reason = fr
        usage = obj.get("usage")
        if usage and isinstance(usage, dict):
            self._usage = Usage.from_dict(usage)
        timings = obj.get("timings")
        if timings and isinstance(timings, dict):
            self._timings = Timings.from_dict(timings)
        if self._model is None and obj.get("model"):
            self._model = str(obj["model"])
        return out


class _Cancelled(Exception):
    """Internal: the request was cancelled before the answer started."""


# ------------------------------------------------------------------ error mapping


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _error_text(err: Any) -> tuple[str, str]:
    """(message, type) from the many shapes servers use for errors."""
    if isinstance(err, dict):
        inner = err.get("error", err)
        if isinstance(inner, dict):
            msg = inner.get("message") or inner.get("detail") or json.dumps(inner)
            return str(msg), str(inner.get("type") or "")
        if isinstance(inner, str):
            return inner, ""
        detail = err.get("detail") or err.get("message")
        if detail:
            return str(detail), ""
        return json.dumps(err), ""
    return str(err), ""


_CTX_PATTERNS = (
    "exceeds the available context size",
    "larger than the max context size",
    "maximum context length",
    "context length exceeded",
    "context_length_exceeded",
    "too many tokens",
)


def _is_context_overflow(msg: str) -> bool:
    low = msg.lower()
    return any(p in low for p in _CTX_PATTERNS)


def _overflow(ep: ChatEndpoint, msg: str) -> ContextOverflowError:
    numbers = [int(n) for n in re.findall(r"(\d+) tokens", msg)]
    n_prompt = n_ctx = None
    m = re.search(r"\((\d+) tokens\) (?:exceeds|is larger)[^(]*\((\d+)", msg)
    if m:
        n_prompt, n_ctx = int(m.group(1)), int(m.group(2))
    elif len(numbers) >= 2:
        # OpenAI/vLLM: "maximum context length is N tokens. However, you requested M tokens"
        n_ctx, n_prompt = numbers[0], numbers[1]
    detail = (
        f" ({n_prompt} tokens, the context holds {n_ctx})"
        if n_prompt is not None and n_ctx is not None
        else ""
    )
    return ContextOverflowError(
        f"The conversation is too long for the engine's context window{detail}. "
        f"The engine at {ep.root} said: {msg}",
        "Start a new conversation, remove earlier messages or images, or restart the "
        "engine with a larger context (-c).",
        n_prompt,
        n_ctx,
    )


def _status_error(ep: ChatEndpoint, status: int, content: bytes, path: str) -> ChatError:
    try:
        parsed = json.loads(content.decode("utf-8", "replace")) if content else ""
    except ValueError:
        parsed = content.decode("utf-8", "replace").strip()[:300]
    msg, etype = _error_text(parsed) if parsed else ("", "")
    said = f": {msg}" if msg else ""
    if status == 401:
        if ep.api_key:
            return AuthError(
                f"The server at {ep.root} refused the API key (HTTP 401{said}).",
                "Check the key: it must be the one the server was started with.",
            )
        return AuthError(
            f"The server at {ep.root} needs an API key (HTTP 401{said}).",
            "Give the server's key (--api-key, or the endpoint's key setting).",
        )
    if status == 403:
        return AuthError(
            f"The server at {ep.root} does not allow this request (HTTP 403{said}).",
            "Check the API key and its permissions.",
        )
    if status == 400 and (etype == "exceed_context_size_error" or _is_context_overflow(msg)):
        return _overflow(ep, msg)
    if status == 404:
        return ChatError(
            f"{ep.root} has no {path} (HTTP 404{said}).",
            "Check the URL: it must point at an OpenAI-compatible server "
            "(for example http://127.0.0.1:8080).",
        )
    if status == 501 and "image input is not supported" in msg:
        from k3desk.core.chat.images import ImageError

        return ImageError(
            f"The engine at {ep.root} cannot read images: {msg}",
            "Start the engine with the tier's mmproj file (--mmproj), or send text only.",
        )
    if status == 503:
        loading = "loading" in msg.lower()
        return EngineUnavailableError(
            f"The engine at {ep.root} is "
            + ("still loading the model" if loading else "not ready")
            + f" (HTTP 503{said}).",
            "Wait until it is ready, then send again.",
        )
    if status >= 500:
        return ChatError(
            f"The engine at {ep.root} failed (HTTP {status}{said}).",
            "Retry; if it keeps failing, check the engine log.",
        )
    return ChatError(
        f"The engine at {ep.root} rejected the request (HTTP {status}{said}).",
        "Check the message and the settings, then send again.",
    )


def _transport_error(
    ep: ChatEndpoint, exc: httpx.TransportError, *, before_answer: bool
) -> ChatError:
    if isinstance(exc, httpx.ConnectError):
        reason = str(exc) or "connection failed"
        if "refused" in reason.lower():
            reason = "connection refused"
        return EngineUnavailableError(
            f"Cannot connect to the engine at {ep.root} ({reason}).",
            "If the engine is starting or restarting, wait a moment and send again; "
            "otherwise start it, or check the URL.",
        )
    if isinstance(exc, httpx.ConnectTimeout):
        return EngineUnavailableError(
            f"The engine at {ep.root} did not accept the connection in time.",
            "Check that the URL is right and the server is running.",
        )
    if isinstance(exc, httpx.ReadTimeout):
        return EngineUnavailableError(
            f"The engine at {ep.root} accepted the request but did not answer in time.",
            "It may be overloaded or stuck; check the engine log, then retry.",
        )
    if before_answer and isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        return ChatStreamError(
            f"The engine at {ep.root} closed the connection before answering "
            f"({exc or type(exc).__name__}).",
            "The engine may have crashed or be restarting; check the engine log, then retry.",
            ChatResult(text="", partial=True),
        )
    return ChatError(f"Talking to the engine at {ep.root} failed: {exc or type(exc).__name__}.")


def _cut_message(ep: ChatEndpoint, result: ChatResult, why: str) -> str:
    got = len(result.text) + len(result.reasoning)
    return (
        f"The engine at {ep.root} stopped in the middle of the answer ({why}); "
        f"{got} characters had arrived."
    )


__all__ = [
    "THINKING_EFFORTS",
    "AuthError",
    "Capabilities",
    "ChatClient",
    "ChatDelta",
    "ChatEndpoint",
    "ChatError",
    "ChatMessage",
    "ChatResult",
    "ChatSettings",
    "ChatStream",
    "ChatStreamError",
    "ContextOverflowError",
    "EngineUnavailableError",
]
