"""An attached OpenAI-compatible server (``chat --url``, an endpoint) turned hostile.

``HostileChat(mode)`` answers ``/v1/chat/completions`` (and ``/v1/models``) the way
``mode`` says, generating what it sends as it goes (nothing huge is held here):

* ``long_line``: one ``data:`` line that never ends;
* ``flood``: ``data:`` lines without the blank line that ends an event, for ever;
* ``pings``: an endless run of tiny content events (one token each);
* ``gzip_bomb``: a gzip'ed stream of 1 GiB of SSE comment lines (a MiB on the wire);
* ``big_error``: HTTP 500 with a 200 MB body;
* ``big_models``: a 300 MB ``/v1/models`` (and no ``/props``);
* ``wrong_types``: events whose fields have the wrong JSON types (``events`` says which);
* ``escapes``: an answer with terminal escape sequences in it.

``seen`` keeps (path, Authorization) of every request; ``sent`` counts the bytes sent.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MiB = 1024 * 1024


def event(content: str, finish: str | None = None) -> bytes:
    obj = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class HostileChat:
    def __init__(self, mode: str, *, events: list[Any] | None = None) -> None:
        self.mode = mode
        self.events = events or []
        self.seen: list[tuple[str, str | None]] = []
        self.sent = 0
        self.stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.seen.append((self.path, self.headers.get("Authorization")))
                owner.get(self)

            def do_POST(self) -> None:
                owner.seen.append((self.path, self.headers.get("Authorization")))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                owner.post(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> HostileChat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ answers
    def get(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/v1/models") and self.mode == "big_models":
            head = b'{"object": "list", "data": [{"id": "k3", "pad": "'
            self.stream(h, 200, "application/json", self.padded(head, 300 * MiB), length=True)
            return
        if h.path.startswith("/v1/models"):
            body = json.dumps({"object": "list", "data": [{"id": "k3"}]}).encode()
            self.stream(h, 200, "application/json", iter([body]), length=True)
            return
        self.stream(h, 404, "application/json", iter([b'{"error": "not found"}']), length=True)

    def post(self, h: BaseHTTPRequestHandler) -> None:
        mode = self.mode
        if mode == "big_error":
            head = b'{"error": {"message": "'
            self.stream(h, 500, "application/json", self.padded(head, 200 * MiB), length=True)
        elif mode == "gzip_bomb":
            self.stream(h, 200, "text/event-stream", self.gzipped(self.comments()), gzip=True)
        elif mode == "long_line":
            self.stream(h, 200, "text/event-stream", self.long_line())
        elif mode == "flood":
            self.stream(h, 200, "text/event-stream", self.flood())
        elif mode == "pings":
            self.stream(h, 200, "text/event-stream", self.tokens())
        elif mode == "wrong_types":
            body = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in self.events]
            self.stream(h, 200, "text/event-stream", iter([*body, b"data: [DONE]\n\n"]))
        elif mode == "escapes":
            answer = "safe \x1b]0;owned\x07\x1b[2J\x1b[31mred\x9b1m\r hidden"
            parts = [event(answer), event("", "stop"), b"data: [DONE]\n\n"]
            self.stream(h, 200, "text/event-stream", iter(parts))

    def stream(
        self,
        h: BaseHTTPRequestHandler,
        status: int,
        ctype: str,
        chunks: Iterator[bytes],
        *,
        length: bool = False,
        gzip: bool = False,
    ) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        if gzip:
            h.send_header("Content-Encoding", "gzip")
        if length:
            body = b"".join(chunks) if status == 404 else None
            if body is not None:
                h.send_header("Content-Length", str(len(body)))
                h.end_headers()
                h.wfile.write(body)
                return
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        try:
            for chunk in chunks:
                if self.stop.is_set():
                    return
                h.wfile.write(chunk)
                self.sent += len(chunk)
        except OSError:
            return  # the client hung up: what a bounded client does

    # ------------------------------------------------------------------ bodies
    def padded(self, head: bytes, size: int) -> Iterator[bytes]:
        yield head
        block = b"x" * MiB
        for _ in range(size // MiB):
            yield block
        yield b'"}]}'

    def tokens(self) -> Iterator[bytes]:
        one = event("tok ")
        batch = one * 256
        for _ in range((1 << 30) // len(batch)):
            yield batch

    def comments(self) -> Iterator[bytes]:
        line = b":" + b" " * (64 * 1024 - 2) + b"\n"
        batch = line * 16
        for _ in range(1024):
            yield batch

    def long_line(self) -> Iterator[bytes]:
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "'
        block = b"x" * MiB
        for _ in range(1024):
            yield block

    def flood(self) -> Iterator[bytes]:
        line = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n'
        batch = line * 4096
        while True:
            yield batch

    def gzipped(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        for chunk in chunks:
            out = z.compress(chunk)
            if out:
                yield out
        yield z.flush()
