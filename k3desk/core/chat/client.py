"""A streaming client for OpenAI-compatible ``/v1/chat/completions`` servers.

It talks to the llama-server k3desk starts and, the same way, to any remote
OpenAI-compatible URL (vLLM, a SparkInfer bridge, a hosted API).  Answers stream
as server-sent events; content and reasoning deltas are delivered as they arrive,
through an iterator (:meth:`ChatClient.stream`) or callbacks (:meth:`ChatClient.chat`).

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
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import httpx

from k3desk.core.chat.images import PreparedImage, ensure_vision
from k3desk.core.chat.model import ChatSettings, Role, Timings, Usage
from k3desk.core.errors import ChatError
from k3desk.core.progress import CancelToken
from k3desk.core.safepaths import scrub

THINKING_EFFORTS = ("low", "high", "max")  # what the Kimi-K3 chat template accepts


# ------------------------------------------------------------------ errors


class EngineUnavailableError(ChatError):
    """The server cannot be reached, is loading, or is restarting."""


class AuthError(ChatError):
    """The server refused the API key (or wanted one)."""


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


@dataclass(frozen=True)
class Capabilities:
    """What the server says about itself (``/props``, else ``/v1/models``)."""

    vision: bool | None  # None: the server does not say
    n_ctx: int | None
    model: str | None
    source: Literal["props", "models"]


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

DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=60.0, pool=10.0)
# llama-server sends nothing until the prompt is read, which for a long conversation
# on a big MoE partly in RAM can take many minutes: no read limit on answers by
# default (cancelling still ends them at once).
DEFAULT_ANSWER_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=60.0, pool=10.0)


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
        self.endpoint = endpoint
        self.answer_timeout = answer_timeout
        # No keep-alive: every request gets its own connection, so cancelling one
        # can shut that socket down without touching another request's.
        self._http = httpx.Client(
            timeout=timeout,
            transport=transport,
            limits=httpx.Limits(max_keepalive_connections=0),
            headers=endpoint.headers(),
        )
        self._caps: Capabilities | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

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

    def _probe(self) -> Capabilities:
        ep = self.endpoint
        props = self._get_json("/props")
        if isinstance(props, dict) and (
            "modalities" in props or "default_generation_settings" in props
        ):
            modalities = props.get("modalities") or {}
            dgs = props.get("default_generation_settings") or {}
            n_ctx = dgs.get("n_ctx") if isinstance(dgs, dict) else None
            model = props.get("model_alias") or None
            if not model and props.get("model_path"):
                model = str(props["model_path"]).replace("\\", "/").rsplit("/", 1)[-1]
            vision = modalities.get("vision") if isinstance(modalities, dict) else None
            return Capabilities(
                vision=None if vision is None else bool(vision),
                n_ctx=int(n_ctx) if isinstance(n_ctx, int) and n_ctx > 0 else None,
                model=model,
                source="props",
            )
        models = self._get_json("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise ChatError(
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
        return Capabilities(
            vision=vision_m,
            n_ctx=int(n_ctx_raw) if isinstance(n_ctx_raw, int) and n_ctx_raw > 0 else None,
            model=str(first["id"]) if first.get("id") is not None else None,
            source="models",
        )

    def _get_json(self, path: str) -> Any:
        url = self.endpoint.url(path)
        try:
            resp = self._http.get(url)
        except httpx.TransportError as exc:
            raise _transport_error(self.endpoint, exc, before_answer=True) from None
        if resp.status_code in (401, 403):
            raise _status_error(self.endpoint, resp.status_code, resp.content, path)
        if resp.status_code == 503:
            raise _status_error(self.endpoint, resp.status_code, resp.content, path)
        if resp.status_code != 200:
            return None
        try:
            return resp.json()
        except ValueError:
            return None

    # ---------------------------------------------------------- chat

    def build_body(
        self, messages: Sequence[ChatMessage], settings: ChatSettings | None = None
    ) -> dict[str, Any]:
        """The JSON request for ``messages`` (validates the settings first)."""
        s = settings or ChatSettings()
        if s.thinking_effort is not None and s.thinking_effort not in THINKING_EFFORTS:
            raise ChatError(
                f"Unknown thinking effort {s.thinking_effort!r}.",
                f"Use one of: {', '.join(THINKING_EFFORTS)}.",
            )
        if not messages:
            raise ChatError("There is no message to send.")
        kwargs: dict[str, Any] = {"thinking": s.thinking}
        if s.thinking and s.thinking_effort:
            kwargs["thinking_effort"] = s.thinking_effort
        body: dict[str, Any] = {
            "messages": [m.to_openai() for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": s.temperature,
            "top_p": s.top_p,
            "chat_template_kwargs": kwargs,
        }
        if s.max_tokens is not None:
            body["max_tokens"] = s.max_tokens
        if s.seed is not None:
            body["seed"] = s.seed
        model = self.endpoint.model
        if model is None and self._caps is not None:
            model = self._caps.model
        if model:
            body["model"] = model
        body.update(s.extra_body)
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
        elif self.endpoint.model is None and self._caps is None:
            # servers other than llama-server need the model id; ask once
            with contextlib.suppress(ChatError):
                self.capabilities()
        body = self.build_body(messages, settings)
        return ChatStream(self, body, cancel)

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
        self, client: ChatClient, body: Mapping[str, Any], cancel: CancelToken | None
    ) -> None:
        self._client = client
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
        if event == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
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
        # shutdown() (unlike close()) wakes a thread blocked in recv() on this socket
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def _snapshot(self, *, partial: bool, cancelled: bool = False) -> ChatResult:
        return ChatResult(
            text="".join(self._text),
            reasoning="".join(self._reasoning),
            finish_reason=self._finish_reason,
            usage=self._usage,
            timings=self._timings,
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
            headers={"Accept": "text/event-stream"},
            timeout=client.answer_timeout,
            extensions={"trace": self._trace},
        )
        self._cancel.on_cancel(self._abort)
        if self._cancel.cancelled:
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
        self._response = resp
        if resp.status_code != 200:
            try:
                content = resp.read()
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

    def _read(self, resp: httpx.Response) -> Iterator[ChatDelta]:
        ep = self._client.endpoint
        data_lines: list[str] = []
        done = False
        try:
            for line in resp.iter_lines():
                if done:
                    continue  # read to the end, so the connection closes cleanly
                if line:
                    if line.startswith("data:"):
                        data_lines.append(line[6:] if line.startswith("data: ") else line[5:])
                    elif line.startswith("error:"):
                        data_lines.append(json.dumps({"error": _loads(line[6:].strip())}))
                    continue  # comments (":" pings), "event:", "id:", "retry:"
                if not data_lines:
                    continue
                payload = data_lines[0] if len(data_lines) == 1 else "\n".join(data_lines)
                data_lines.clear()
                if payload == "[DONE]":
                    done = True
                    continue
                deltas = self._handle(payload)
                if deltas:
                    yield from deltas
            if data_lines and not done:
                payload = "\n".join(data_lines)
                if payload == "[DONE]":
                    done = True
                else:
                    yield from self._handle(payload)
        except httpx.TransportError as exc:
            if self._aborted:
                self.result = self._snapshot(partial=True, cancelled=True)
                return
            result = self._snapshot(partial=True)
            raise ChatStreamError(
                _cut_message(ep, result, str(exc) or type(exc).__name__),
                "The engine may have crashed or been stopped; the partial answer is kept. "
                "Check the engine log, then retry.",
                result,
            ) from None
        if self._aborted:
            self.result = self._snapshot(partial=True, cancelled=True)
            return
        if not done and self._finish_reason is None:
            result = self._snapshot(partial=True)
            raise ChatStreamError(
                _cut_message(ep, result, "the stream ended without a final message"),
                "The engine may have crashed or been stopped; the partial answer is kept. "
                "Check the engine log, then retry.",
                result,
            )
        self.result = self._snapshot(partial=False)

    def _handle(self, payload: str) -> list[ChatDelta]:
        """Record one event's data; return its deltas (usually one, often none)."""
        try:
            obj = json.loads(payload)
        except ValueError:
            return []
        if not isinstance(obj, dict):
            return []
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
        for choice in obj.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta:
                r = delta.get("reasoning_content") or delta.get("reasoning")
                if r:
                    self._reasoning.append(r)
                    out.append(ChatDelta("reasoning", r))
                c = delta.get("content")
                if c:
                    self._text.append(c)
                    out.append(ChatDelta("content", c))
                if out and self._t_first is None:
                    self._t_first = time.monotonic()
            fr = choice.get("finish_reason")
            if fr:
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
