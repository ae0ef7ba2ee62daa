"""The local API's front before llama-server's router: only what the router cannot do.

llama-server b11434's router (:mod:`k3desk.core.engines.router`) loads the model a request
names and forwards the request to it, which is most of "load on demand".  Two promises it
cannot keep, read in its source (tools/server/server-models.cpp):

* ``server_models::ensure_model_ready`` waits for a load with no bound of its own: a
  client whose request names a model being loaded hangs until the load ends or its own
  timeout fires.  The front waits at most ``load_wait`` seconds and then answers **503 with
  Retry-After** (the load goes on; the OpenAI and Anthropic SDKs retry after that many
  seconds by themselves).
* a model that is not in its preset file is "model name=X is not found": a person whose
  set k3desk left out (its plan streams from disk here) is not told why.  The front answers
  **400 with the reason** k3desk gave, and what to do.

``k3desk serve`` puts the same front before its one engine, with nothing to gate: for the
address itself, which then answers while the engine starts or restarts (503 with
Retry-After) and stays held between attempts.

Everything else goes through as bytes: the request as it came (its ``Connection`` made
``close``, so each request is one connection to the router and a streamed answer ends
when the router closes it), the answer as the router gives it, keys, CORS and errors
included.  The router checks keys; the front's own answers are given only to a request
carrying a valid one (any other goes on to the router, which refuses it with 401).
Only the body of a POST carrying a valid key is read (to find the ``model`` it names),
and only up to :data:`INSPECT_LIMIT`; any other is passed on as it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import resource
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from k3desk.core.engines.anthropic_shape import (
    anthropic_answer,
    anthropic_to_oai,
    streamed_anthropic_answer,
)
from k3desk.core.engines.responses_shape import (
    responses_answer,
    responses_to_oai,
    streamed_responses_answer,
)

HEAD_LIMIT = 64 * 1024  # a request's line and headers (431 beyond)
HEAD_SECONDS = 30.0  # for a client to send them (a slow client is dropped after)
CLOSE_SECONDS = 30.0  # for a client to take the rest of an answer all written
BODY_SECONDS = 300.0  # for a body the front reads
INSPECT_LIMIT = 32 << 20  # bodies read to find the model they name; larger pass as they are
POLL_SECONDS = 0.25  # the router's model states, asked this often while one loads
TRUSTED_SECONDS = 1.0  # a "loaded" seen this recently is not asked again
LOAD_RATE = 1e9  # bytes a second a load is expected to read (Retry-After's estimate)
RETRY_MAX = 60  # seconds: the SDKs honour a Retry-After up to this
# after passing a piece of an answer on, the router is not read again for this long: the
# tokens that come meanwhile go on together (one wake-up of the front and of the client for
# several; on 2 cores each wake-up is CPU taken from the engine's decode threads), each held
# back 5 ms at most, which no reader sees; the first pieces (the head, the first token) are
# never held
RELAY_REST = 0.005
RELAY_FREE = 2
RELAY_BULK = 32 * 1024  # a piece this large is no token: a long answer goes on unrested
# the APIs whose conversations are kept: their answers' shapes
OPENAI, ANTHROPIC, RESPONSES = "openai", "anthropic", "responses"
# requests that never take the engine's slot (its content stays known across them)
SLOT_FREE = (
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/count_tokens",
    "/input_tokens",
    "/v1/models",
)
# a tool's conversation is kept when the engine has answered nothing else for this long
IDLE_SECONDS = 5.0
FLUSH_SETTLE = 2.0  # seconds a stop waits for a chat answer still going through
CAPTURE_LIMIT = 4 << 20  # an answer read to keep its conversation; a longer one is not kept
RELAY_BUFFER = 1 << 20  # an answer's bytes held for a slow client before the router waits
_HOP = frozenset({"connection", "keep-alive", "proxy-connection"})
_REASONS = {
    400: "Bad Request",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class Upstream:
    """Where the engine listens now (loopback), the app's own key for it and its process."""

    host: str
    port: int
    api_key: str
    pid: int = 0


class Conversations(Protocol):
    """What keeps tools' conversations in the engine's state (k3desk.core.app's; the front
    only says when).  Both are called in a thread of their own and may take seconds."""

    def resume(self, body: dict[str, Any], engine: Upstream) -> None:
        """Before a chat request whose conversation the engine's slot does not hold (a
        fresh engine's first, or a switch): bring back the state kept for it, if any."""

    def answered(self, body: dict[str, Any], answer: dict[str, Any], engine: Upstream) -> None:
        """The engine went idle after answering ``body`` with ``answer`` (the assistant's
        message: :func:`answer_of`), or another conversation is about to take its slot, or
        it is about to stop: keep its state."""

    def conversation(self, body: dict[str, Any]) -> str:
        """Which conversation a request continues (one id for all of its turns)."""


@dataclass(frozen=True)
class _Answered:
    body: dict[str, Any]
    raw: bytes  # the answer as it came off the wire (read when it is kept, off the loop)
    engine: Upstream
    conversation: str
    api: str  # OPENAI, ANTHROPIC or RESPONSES: the shape of the answer


@dataclass(frozen=True)
class FrontConfig:
    host: str  # where tools reach the local API
    port: int  # 0: a free one
    client_keys: tuple[str, ...] = field(default=(), repr=False)
    # names a request may give that k3desk left out, with why and what to do
    left_out: Mapping[str, str] = field(default_factory=dict)
    # names the router serves, with each set's size (the load time's estimate)
    served: Mapping[str, int] = field(default_factory=dict)
    load_wait: float = 30.0  # seconds a request waits for its model to load
    allow_origin: str = ""  # Access-Control-Allow-Origin of the front's own answers
    conversations: Conversations | None = None  # tools' conversations kept (one slot only)
    # called (in a thread of its own, waited for) before a tool's request that may take
    # the engine's slot goes on, for another user of that slot (the app window's chat) to
    # finish keeping its own conversation and forget what it believed the slot holds
    on_slot: Callable[[], None] | None = None


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def length(self) -> int | None:
        raw = self.header("content-length")
        if raw is None:
            return None
        if not raw.strip().isdigit():
            raise ValueError("Content-Length is not a number")
        return int(raw)

    def upstream_head(self, *, drop_expect: bool) -> bytes:
        lines = [f"{self.method} {self.target} HTTP/1.1"]
        for key, value in self.headers:
            low = key.lower()
            if low in _HOP or (drop_expect and low == "expect"):
                continue
            lines.append(f"{key}: {value}")
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(head: bytes) -> _Request:
    """A request's line and headers; :class:`ValueError` for anything HTTP/1.1 refuses."""
    text = head.decode("latin-1")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
        raise ValueError("not an HTTP/1.x request line")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        key, sep, value = line.partition(":")
        if not sep or not key or key != key.strip():
            raise ValueError("a header without a name")
        headers.append((key, value.strip()))
    return _Request(parts[0], parts[1], tuple(headers))


def model_named(body: bytes) -> str | None:
    """The ``model`` a JSON body names (None when it is not JSON or names none)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


def error_answer(
    status: int, message: str, *, anthropic: bool, retry_after: int = 0, allow_origin: str = ""
) -> bytes:
    """An answer in the shape the client's API uses: llama-server's own for OpenAI's
    (``format_error_response``: code, message, type), Anthropic's for ``/v1/messages``."""
    kind = {400: "invalid_request_error", 503: "unavailable_error"}.get(status, "server_error")
    if anthropic:
        kind = {400: "invalid_request_error", 503: "overloaded_error"}.get(status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"code": status, "message": message, "type": kind}}
    data = json.dumps(body).encode()
    head = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(data)}",
        "Connection: close",
    ]
    if retry_after:
        head.append(f"Retry-After: {retry_after}")
    if allow_origin:
        head.append(f"Access-Control-Allow-Origin: {allow_origin}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data


class RouterFront:
    """Listens at the local API's address and passes requests to the engine (a router or
    one model) that ``upstream()`` names (None while it is not ready: 503, Retry-After 5)."""

    def __init__(self, config: FrontConfig, upstream: Callable[[], Upstream | None]) -> None:
        self.config = config
        self._upstream = upstream
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._loaded: dict[str, float] = {}  # name -> when "loaded" was last seen
        self._loads: dict[str, float] = {}  # name -> when its load started (monotonic)
        self._http: httpx.AsyncClient | None = None
        # the conversation each engine's slot holds, by its (port, process)
        self._holds: dict[tuple[int, int], str] = {}
        self._keeping: asyncio.TimerHandle | None = None  # a conversation kept when idle
        self._pending: _Answered | None = None  # answered, its state not kept yet
        self._chats = 0  # chat requests going on now
        self._kept: set[asyncio.Future[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()  # clients' connections open now

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1] if self._sock is not None else 0

    def start(self) -> int:
        """Bind (an :class:`OSError` when the address is taken) and serve in a thread of
        its own; the port listened on."""
        _more_files()
        # as llama-server binds (SO_REUSEADDR): a closed listener's TIME_WAIT is no owner
        self._sock = socket.create_server((self.config.host, self.config.port), backlog=1024)
        self._thread = threading.Thread(target=self._run, name="local-api-front", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        if self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._http = httpx.AsyncClient(timeout=10.0)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, sock=self._sock, limit=HEAD_LIMIT)
        )
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._wind_down()
            if self._sock is not None:
                self._sock.close()
            self._loop.close()

    def _wind_down(self) -> None:
        """Finish what is still open when the front stops, so that no connection is left
        to the garbage collector: each request going on is cancelled and waited for, a
        client that would not take its answer is cut off, and the loop turns until every
        connection's close is done (``connection_lost`` runs on the loop's next turn)."""
        run = self._loop.run_until_complete
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            run(asyncio.gather(*tasks, return_exceptions=True))
        for writer in list(self._writers):
            writer.transport.abort()
        with contextlib.suppress(Exception):
            if self._http is not None:
                run(self._http.aclose())
        for _ in range(3):
            run(asyncio.sleep(0))
        with contextlib.suppress(Exception):
            run(self._loop.shutdown_default_executor())

    # ------------------------------------------------------------------ one connection
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._one(reader, writer)
        except asyncio.LimitOverrunError:
            writer.write(error_answer(431, "The request's headers are too long.", anthropic=False))
        except ValueError as e:
            writer.write(error_answer(400, f"Not an HTTP request: {e}.", anthropic=False))
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass  # the client went or was too slow: nothing to answer
        finally:
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), CLOSE_SECONDS)
            writer.transport.abort()  # a no-op once closed; else the client is given up on
            self._writers.discard(writer)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
        req = parse_head(head)
        length = req.length()
        chunked = "chunked" in (req.header("transfer-encoding") or "").lower()
        body = b""
        # a request without a valid key goes to the router unread: it refuses it with 401
        # before reading the body, as it would without the front
        inspected = (
            req.method == "POST"
            and not chunked
            and 0 < (length or 0) <= INSPECT_LIMIT
            and self._authorized(req)
        )
        if inspected:
            if (req.header("expect") or "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await asyncio.wait_for(reader.readexactly(length or 0), BODY_SECONDS)
            model = model_named(body)
            if model is not None:
                answer = await self._gate(model, req)
                if answer is not None:
                    writer.write(answer)
                    return
        up = self._upstream()
        if up is None:
            writer.write(self._answer(503, "The local API's engine is starting.", req, 5))
            return
        if self.config.on_slot is not None and _takes_slot(req) and self._authorized(req):
            await asyncio.to_thread(self.config.on_slot)
        chat = await self._before_chat(req, body, up) if inspected else None
        captured = None
        try:
            captured = await self._forward(
                req, body, up, reader, writer, inspected=inspected, capture=chat is not None
            )
        finally:
            if chat is not None:
                self._chats -= 1
                self._after_chat(*chat, captured, up)

    async def _forward(
        self,
        req: _Request,
        body: bytes,
        up: Upstream,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        inspected: bool,
        capture: bool,
    ) -> bytes | None:
        """The request to the engine (``body``: what the front read of it, when
        ``inspected``; the rest is pumped on) and its answer back; the answer's bytes if
        ``capture`` (None when they were not all kept)."""
        length = req.length()
        chunked = "chunked" in (req.header("transfer-encoding") or "").lower()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            upstream, relay = await asyncio.get_running_loop().create_connection(
                lambda: _Relay(writer, done, capture=capture), up.host, up.port
            )
        except OSError:
            writer.write(self._answer(503, "The local API's engine is restarting.", req, 5))
            return None
        pump = None
        try:
            upstream.write(req.upstream_head(drop_expect=inspected) + body)
            if not inspected and (chunked or (length or 0) > 0):
                pump = asyncio.ensure_future(_pump(reader, relay, None if chunked else length))
            await done
        finally:
            if pump is not None:
                pump.cancel()
            upstream.close()
        return relay.captured

    # ------------------------------------------------------------ tools' conversations
    async def _before_chat(
        self, req: _Request, body: bytes, up: Upstream
    ) -> tuple[dict[str, Any], str] | None:
        """A chat request's body in the Chat Completions shape and its API, when tools'
        conversations are kept.  Before it goes on: the conversation answered last is kept
        if this one is another (switched away from), and this one's kept state is brought
        back if the engine's slot holds another (or nothing: a fresh engine)."""
        conv = self.config.conversations
        if conv is None:
            return None
        engine = (up.port, up.pid)  # a restart may keep the port, never the process
        chat = _chat_body(req, body)
        if chat is None:
            if _takes_slot(req):
                self._holds.pop(engine, None)  # it may take the slot: no longer known
            return None
        data, _ = chat
        conversation = conv.conversation(data)
        self._idle_timer(None)
        pending, self._pending = self._pending, None
        if pending is not None and pending.conversation != conversation:
            await self._keep(pending)  # the slot is about to be another conversation's
        if self._holds.get(engine) != conversation:
            self._holds[engine] = conversation
            with contextlib.suppress(Exception):  # a failed restore only means a re-read
                await asyncio.to_thread(conv.resume, data, up)
        self._chats += 1  # until its answer is read (flush waits for it)
        return chat

    def _after_chat(
        self, body: dict[str, Any], api: str, captured: bytes | None, up: Upstream
    ) -> None:
        """Keep the conversation once the engine has been idle :data:`IDLE_SECONDS`."""
        conv = self.config.conversations
        if conv is None or captured is None:
            return
        self._pending = _Answered(body, captured, up, conv.conversation(body), api)
        self._idle_timer(asyncio.get_running_loop().call_later(IDLE_SECONDS, self._idle))

    def _idle_timer(self, timer: asyncio.TimerHandle | None) -> None:
        if self._keeping is not None:
            self._keeping.cancel()
        self._keeping = timer

    def _idle(self) -> None:
        self._keeping = None
        self._keep_pending()

    def _keep_pending(self) -> None:
        """Start keeping the conversation answered last, as a task a flush waits for (a
        later flush too, where an earlier one gave up waiting); not where the slot may hold
        another since (the window's chat took it): keeping it would read it all again."""
        pending, self._pending = self._pending, None
        up = pending.engine if pending is not None else None
        if (
            pending is not None
            and up is not None
            and (self._holds.get((up.port, up.pid)) == pending.conversation)
        ):
            task = asyncio.ensure_future(self._keep(pending))
            self._kept.add(task)
            task.add_done_callback(self._kept.discard)

    async def _keep(self, answered: _Answered) -> None:
        conv = self.config.conversations
        if conv is not None:
            with contextlib.suppress(Exception):  # not kept: the next time reads it again
                await asyncio.to_thread(_keep_answered, conv, answered)

    def flush(self, timeout: float = 120.0) -> bool:
        """Keep the conversation answered last now, and wait for any being kept (before
        the engine stops); False when that took more than ``timeout`` seconds."""
        if self._thread is None:
            return True

        async def now() -> None:
            # an answer the tool already has may still be on its way through the front
            settle = time.monotonic() + FLUSH_SETTLE
            while self._chats and time.monotonic() < settle:
                await asyncio.sleep(0.02)
            self._idle_timer(None)
            self._keep_pending()
            if self._kept:
                await asyncio.gather(*self._kept, return_exceptions=True)

        done = asyncio.run_coroutine_threadsafe(now(), self._loop)
        try:
            done.result(timeout)
        except TimeoutError:
            return False
        except Exception:  # noqa: BLE001 - not kept: the next time reads it again
            return True
        return True

    def slot_taken(self, timeout: float = 120.0) -> bool:
        """Another user of the engine's one slot (the app window's own chat) is about to
        take it: the conversation a tool had answered last is kept first (:meth:`flush`,
        False when that took more than ``timeout`` seconds), and the front forgets what
        the slot holds, so that a tool's next request brings its conversation back."""
        kept = self.flush(timeout)
        if self._thread is not None:
            done = asyncio.run_coroutine_threadsafe(self._forget_slots(), self._loop)
            with contextlib.suppress(Exception):
                done.result(timeout)
        return kept

    async def _forget_slots(self) -> None:
        self._holds.clear()

    # ------------------------------------------------------------------ the front's own
    def _authorized(self, req: _Request) -> bool:
        given = req.header("x-api-key") or ""
        auth = req.header("authorization") or ""
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if not given:
            return False
        up = self._upstream()
        keys = (*self.config.client_keys, *((up.api_key,) if up is not None else ()))
        return any(hmac.compare_digest(given.encode(), k.encode()) for k in keys)

    def _answer(self, status: int, message: str, req: _Request, retry: int = 0) -> bytes:
        anthropic = req.target.split("?")[0].rstrip("/").endswith("/messages")
        return error_answer(
            status, message, anthropic=anthropic, retry_after=retry,
            allow_origin=self.config.allow_origin if req.header("origin") else "",
        )  # fmt: skip

    async def _gate(self, model: str, req: _Request) -> bytes | None:
        """None when the request may go to the router now; else the front's answer."""
        why = self.config.left_out.get(model)
        if why is not None:
            return self._answer(400, f"Model {model!r} is not served here: {why}", req)
        if model not in self.config.served:
            return None  # the router's own "not found"
        now = time.monotonic()
        if now - self._loaded.get(model, -math.inf) < TRUSTED_SECONDS:
            return None
        deadline = now + self.config.load_wait
        while True:
            state, failed = await self._state(model)
            if state in ("loaded", "sleeping"):
                self._loaded[model] = time.monotonic()
                self._loads.pop(model, None)
                return None
            if state == "loading":
                self._loads.setdefault(model, time.monotonic())
            elif state == "unloaded" and failed and model in self._loads:
                del self._loads[model]
                return self._answer(
                    500, f"Model {model!r} failed to load; k3desk api serve's log says why.", req
                )
            elif state == "unloaded":
                # the router marks the model loading before /models/load returns
                # (server_models::load): an "unloaded" seen after it is this load's end
                self._loads[model] = time.monotonic()
                await self._post_load(model)
            elif state is None:
                return None  # the router did not say: it answers the request itself
            if time.monotonic() >= deadline:
                return self._answer(503, self._loading_said(model), req, self._retry(model))
            await asyncio.sleep(POLL_SECONDS)

    def _retry(self, model: str) -> int:
        elapsed = time.monotonic() - self._loads.get(model, time.monotonic())
        left = self.config.served.get(model, 0) / LOAD_RATE - elapsed
        return max(1, min(RETRY_MAX, math.ceil(left)))

    def _loading_said(self, model: str) -> str:
        took = time.monotonic() - self._loads.get(model, time.monotonic())
        return (
            f"Model {model!r} is loading ({took:.0f} s so far); it answers when loaded. "
            "Try again after the Retry-After seconds."
        )

    async def _state(self, model: str) -> tuple[str | None, bool]:
        up = self._upstream()
        if up is None or self._http is None:
            return None, False
        try:
            got = await self._http.get(
                f"http://{up.host}:{up.port}/models",
                headers={"Authorization": f"Bearer {up.api_key}"},
            )
            for m in got.json().get("data", []):
                if m.get("id") == model:
                    status = m.get("status") or {}
                    return str(status.get("value")), bool(status.get("failed"))
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        return None, False

    async def _post_load(self, model: str) -> None:
        up = self._upstream()
        if up is None or self._http is None:
            return
        with contextlib.suppress(httpx.HTTPError):
            # "already running" when another request started it first: nothing to do
            await self._http.post(
                f"http://{up.host}:{up.port}/models/load",
                json={"model": model},
                headers={"Authorization": f"Bearer {up.api_key}"},
            )


class _Relay(asyncio.Protocol):
    """One connection to the router: its answer goes to the client in the callback that
    receives it (no coroutine woken per streamed token: on 2 cores that wake-up was CPU
    taken from the engine's decode threads), the router read no faster than the client
    takes the answer (paused past :data:`RELAY_BUFFER`), and the router's connection
    closed as soon as the client is seen gone, which ends the generation there."""

    def __init__(
        self, client: asyncio.StreamWriter, done: asyncio.Future[None], *, capture: bool = False
    ) -> None:
        # the answer's bytes, kept to read what it said (None: not kept, or past the limit)
        self._captured: bytearray | None = bytearray() if capture else None
        self._client = client
        self._done = done
        self._transport: asyncio.Transport | None = None
        self._writable = asyncio.Event()  # the router takes more of a request's body
        self._writable.set()
        self._draining: asyncio.Future[None] | None = None
        self._resting = False
        self._pieces = 0

    @property
    def captured(self) -> bytes | None:
        return bytes(self._captured) if self._captured is not None else None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        client = self._client.transport
        if client.is_closing():  # the client went: stop the router's work for it
            if self._transport is not None:
                self._transport.close()
            return
        client.write(data)
        if self._captured is not None:
            if len(self._captured) + len(data) <= CAPTURE_LIMIT:
                self._captured += data
            else:
                self._captured = None
        self._pieces += 1
        if self._transport is None or self._resting:
            return
        if self._draining is None and client.get_write_buffer_size() > RELAY_BUFFER:
            self._transport.pause_reading()
            self._draining = asyncio.ensure_future(self._drain())
        elif self._draining is None and self._pieces >= RELAY_FREE and len(data) < RELAY_BULK:
            self._resting = True
            self._transport.pause_reading()
            asyncio.get_running_loop().call_later(RELAY_REST, self._rested)

    def _rested(self) -> None:
        self._resting = False
        transport = self._transport
        if self._draining is None and transport is not None and not transport.is_closing():
            transport.resume_reading()

    async def _drain(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            await self._client.drain()
        self._draining = None
        if self._resting:
            return
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()
        if not self._done.done():
            self._done.set_result(None)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def send(self, data: bytes) -> None:
        """A piece of the request's body, at the pace the router reads it."""
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("the router's connection is closed")
        self._transport.write(data)
        await self._writable.wait()


async def _pump(src: asyncio.StreamReader, dst: _Relay, count: int | None) -> None:
    """A request's body (``count`` bytes, or until the client's end) on to the router
    while its answer comes back; a client or router that goes ends it quietly (the
    answer's side says what happened)."""
    left = count
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while left is None or left > 0:
            data = await src.read(65536 if left is None else min(65536, left))
            if not data:
                break
            await dst.send(data)
            if left is not None:
                left -= len(data)


def _keep_answered(conv: Conversations, answered: _Answered) -> None:
    """What the answer said (read here, in the keeping thread: up to 4 MiB of events),
    kept with its conversation as the tool will send it back; nothing where it is no
    answer to keep."""
    answer = answer_of(answered.raw, answered.api)
    if answer is not None:
        conv.answered(
            answered.body, sent_back(answered.body, answer, answered.api), answered.engine
        )


def _takes_slot(req: _Request) -> bool:
    """Whether a request may take the engine's slot (generation; not counting tokens, a
    template, the model list)."""
    return req.method == "POST" and not req.target.split("?")[0].endswith(SLOT_FREE)


def _chat_body(req: _Request, body: bytes) -> tuple[dict[str, Any], str] | None:
    """A chat request's JSON body in the Chat Completions shape, and its API (None for any
    other request): a Messages body as the engine turns it (:mod:`.anthropic_shape`), a
    Responses one too (:mod:`.responses_shape`: None where the engine refuses it)."""
    path = req.target.split("?")[0].rstrip("/")
    if path.endswith("/chat/completions"):
        api = OPENAI
    elif path.endswith("/v1/messages"):
        api = ANTHROPIC
    elif path in ("/v1/responses", "/responses"):
        api = RESPONSES
    else:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if api == RESPONSES:
        turned = responses_to_oai(data)
        return (turned, api) if turned is not None else None
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        return None
    return (data if api == OPENAI else anthropic_to_oai(data)), api


def sent_back(body: dict[str, Any], answer: dict[str, Any], api: str) -> dict[str, Any]:
    """The assistant's ``answer`` as the tool will most likely send it back.  Anthropic
    clients send an answer's thinking blocks back (the API asks for them with tool use),
    and Responses clients its output items, the reasoning item among them (what that API
    keeps a conversation by when nothing is stored).  Most Chat Completions clients send
    the content and tool calls alone (the template then renders an empty thinking block);
    one that sent thinking back before (an earlier assistant message in ``body`` carries
    ``reasoning_content`` or ``reasoning``) sends it again."""
    sends_thinking = api in (ANTHROPIC, RESPONSES) or any(
        isinstance(m, dict)
        and m.get("role") == "assistant"
        and (m.get("reasoning_content") or m.get("reasoning"))
        for m in body.get("messages") or []
    )
    if sends_thinking or "reasoning_content" not in answer:
        return answer
    return {k: v for k, v in answer.items() if k != "reasoning_content"}


def answer_of(raw: bytes, api: str = OPENAI) -> dict[str, Any] | None:
    """The assistant's message a Chat Completions answer gave, as it came off the wire
    (streamed or not), or a Messages or Responses one where ``api`` says so, in the Chat
    Completions shape: its text, and its thinking and tool calls where it has them; None
    where it is no answer to keep: not 200, cut short, several choices, or not read whole."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not sep or lines[0].split(" ")[1:2] != ["200"]:
        return None
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if "chunked" in headers.get("transfer-encoding", "").lower():
        whole = _dechunk(body)
        if whole is None:
            return None
        body = whole
    try:
        streamed = "event-stream" in headers.get("content-type", "")
        if api == ANTHROPIC:
            return (
                streamed_anthropic_answer(body) if streamed else anthropic_answer(json.loads(body))
            )
        if api == RESPONSES:
            return (
                streamed_responses_answer(body) if streamed else responses_answer(json.loads(body))
            )
        if streamed:
            return _streamed(body)
        choices = json.loads(body).get("choices") or []
        if len(choices) != 1:
            return None
        message = choices[0]["message"]
        return _message(
            message.get("content"), message.get("reasoning_content"), message.get("tool_calls")
        )
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None


def _message(content: Any, thinking: Any, calls: Any) -> dict[str, Any] | None:
    """The assistant's message as a tool sends it back in its next request (the fields
    the chat template renders: content, reasoning_content, tool_calls)."""
    if not isinstance(content, str | None) or not isinstance(thinking, str | None):
        return None
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if thinking:
        message["reasoning_content"] = thinking
    if calls:
        said = []
        for call in calls:
            fn = call["function"]
            name, arguments = fn["name"], fn.get("arguments", "")
            if not isinstance(name, str) or not isinstance(arguments, str) or not name:
                return None
            one = {"type": "function", "function": {"name": name, "arguments": arguments}}
            said.append({"id": call["id"], **one} if call.get("id") else one)
        message["tool_calls"] = said
    return message


def _streamed(body: bytes) -> dict[str, Any] | None:
    """The assistant's message a streamed answer's events make up (the deltas of
    llama-server's ``server_chat_msg_diff_to_json_oaicompat``, server-chat.cpp: text,
    thinking, and each tool call by its index: its id and name once, its arguments in
    pieces); None where the stream did not end with a finish reason or has several
    choices."""
    text: list[str] = []
    thinking: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finished = False
    for line in body.split(b"\n"):
        if not line.startswith(b"data: ") or line[6:].strip() == b"[DONE]":
            continue
        choices = json.loads(line[6:]).get("choices") or []
        if not choices:
            continue
        if len(choices) > 1:
            return None
        delta = choices[0].get("delta") or {}
        text.append(delta.get("content") or "")
        thinking.append(delta.get("reasoning_content") or "")
        for piece in delta.get("tool_calls") or ():
            call = calls.setdefault(piece["index"], {"function": {"name": "", "arguments": ""}})
            if piece.get("id"):
                call["id"] = piece["id"]
            fn = piece.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            call["function"]["arguments"] += fn.get("arguments") or ""
        finished = finished or bool(choices[0].get("finish_reason"))
    if not finished:
        return None
    return _message("".join(text), "".join(thinking), [calls[i] for i in sorted(calls)])


def _dechunk(body: bytes) -> bytes | None:
    """A chunked body's bytes (None when it is cut or malformed)."""
    out = bytearray()
    at = 0
    while True:
        end = body.find(b"\r\n", at)
        if end < 0:
            return None
        try:
            size = int(body[at:end].split(b";")[0].strip(), 16)
        except ValueError:
            return None
        start = end + 2
        if len(body) - start < size:
            return None
        if size == 0:
            return bytes(out)
        out += body[start : start + size]
        at = start + size + 2


def _more_files() -> None:
    """A connection through the front holds two descriptors: raise the soft limit to the
    hard one (1,024 is common) so a thousand tools at once do not run out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
