#!/usr/bin/env python3
"""Stand-in for the recipe's FastAPI bridge beside SparkInfer's rank 0 (stdlib http.server).

    k3_bridge.py --engine IP:PORT [--host 127.0.0.1] [--port 8000] [--model-name kimi-k3-neuron]

- ``GET /healthz``: 200 whenever the bridge runs;
- ``GET /readyz``: 503 until the engine's serve socket accepts a connection, then 200
  (it keeps saying ready after a worker died: only a request shows it);
- ``GET /v1/models``: the one model, ``kimi-k3-neuron``;
- ``POST /v1/chat/completions``: OpenAI-compatible, SSE with ``stream: true``; reasoning
  in ``reasoning_content`` only with top-level ``"thinking": true``; text only (image
  parts are refused); one request at a time; no timings in the responses.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ENGINE: tuple[str, int] = ("127.0.0.1", 29600)
MODEL = "kimi-k3-neuron"
ONE_AT_A_TIME = threading.Lock()


def engine_up() -> bool:
    try:
        with socket.create_connection(ENGINE, timeout=1):
            return True
    except OSError:
        return False


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # uvicorn-style access log
        sys.stderr.write(f'INFO:     {self.client_address[0]} - "{self.requestline}" {args[1]}\n')
        sys.stderr.flush()

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._json(200, {"status": "ok"})
        elif self.path == "/readyz":
            if engine_up():
                self._json(200, {"status": "ready"})
            else:
                self._json(503, {"detail": "engine not ready"})
        elif self.path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": MODEL, "object": "model", "created": 0, "owned_by": "sparkinfer"}
                    ],
                },
            )
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            self._json(404, {"detail": "Not Found"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            messages = body["messages"]
        except (ValueError, KeyError, TypeError):
            self._json(422, {"detail": "messages is required"})
            return
        texts: list[str] = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                if any(p.get("type") != "text" for p in content if isinstance(p, dict)):
                    self._json(400, {"detail": "image input is not supported (text only)"})
                    return
                content = " ".join(str(p.get("text", "")) for p in content)
            texts.append(f"{m.get('role')}: {content}")
        request = {
            "prompt": "\n".join(texts),
            "max_tokens": body.get("max_tokens"),
            "thinking": bool(body.get("thinking")),
        }
        with ONE_AT_A_TIME:
            self._generate(request, bool(body.get("stream")))

    def _generate(self, request: dict[str, Any], stream: bool) -> None:
        try:
            sock = socket.create_connection(ENGINE, timeout=600)
        except OSError as exc:
            self._json(503, {"detail": f"engine not reachable: {exc}"})
            return
        with sock:
            sock.sendall(json.dumps(request).encode() + b"\n")
            reader = sock.makefile("rb")
            first = reader.readline()
            msg = json.loads(first) if first else {"error": "engine closed the connection"}
            if "error" in msg:
                self._json(502, {"detail": f"engine error: {msg['error']}"})
                return
            cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
            created = int(time.time())
            if not stream:
                text, reasoning = [], []
                while "done" not in msg:
                    (reasoning if "reasoning" in msg else text).append(
                        msg.get("reasoning") or msg.get("token") or ""
                    )
                    msg = json.loads(reader.readline() or b'{"done": true}')
                message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
                if reasoning:
                    message["reasoning_content"] = "".join(reasoning)
                self._json(
                    200,
                    {
                        "id": cid,
                        "object": "chat.completion",
                        "created": created,
                        "model": MODEL,
                        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                        "usage": {
                            "prompt_tokens": msg.get("prompt_tokens", 0),
                            "completion_tokens": msg.get("generated_tokens", 0),
                            "total_tokens": msg.get("prompt_tokens", 0)
                            + msg.get("generated_tokens", 0),
                        },
                    },
                )
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()

            def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
                obj = {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": MODEL,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
                self.wfile.flush()

            chunk({"role": "assistant"})
            while "done" not in msg:
                if "reasoning" in msg:
                    chunk({"reasoning_content": msg["reasoning"]})
                elif "token" in msg:
                    chunk({"content": msg["token"]})
                line = reader.readline()
                if not line:
                    self.close_connection = True
                    return  # the engine died mid-answer: the stream just stops
                msg = json.loads(line)
            chunk({}, "stop")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()


def main(argv: list[str]) -> int:
    global ENGINE, MODEL
    p = argparse.ArgumentParser()
    p.add_argument("--engine", required=True, help="rank 0's serve socket, IP:PORT")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", default=MODEL)
    a = p.parse_args(argv)
    host, _, port = a.engine.rpartition(":")
    ENGINE, MODEL = (host, int(port)), a.model_name
    httpd = ThreadingHTTPServer((a.host, a.port), Handler)
    sys.stderr.write(
        f"INFO:     Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)\n"
    )
    sys.stderr.flush()
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
