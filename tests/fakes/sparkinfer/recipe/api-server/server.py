#!/usr/bin/env python3
"""Stand-in for the recipe's FastAPI bridge ``api-server/server.py`` (stdlib http.server).

    server.py --host H --port P --tokenizer-dir DIR --chat-template FILE
              --engine-host H --engine-port P --model NAME --default-max-tokens N
              --max-tokens N --max-context-tokens N --engine-timeout-s S [--no-readyz]

(started by ``run-api.sh``, which fills these from the K3_* environment).

- The "tokenizer" is ``DIR/vocab.json`` (piece -> id): a word is its own piece when
  listed, else its UTF-8 bytes as ``<0xNN>`` pieces; ``▁`` separates words.  The chat
  template file must exist; the prompt is rendered as
  ``<|im_ROLE|> content <|im_end|> ... <|im_assistant|> <think>`` (plus ``</think>``
  without thinking), so the model's reasoning ends at ``</think>``.
- Rank 0's serve socket: one connection per request, one line
  ``prompt_ids=..;n_predict=N;stop_ids=..;stream=0|1``; ``tok=ID`` lines back while
  streaming; one final ``ok=1;generated_ids=..;stop_reason=stop|length`` or
  ``ok=0;error=..`` line.  Requests go one at a time.
- ``K3_API_KEY`` (or ``--api-key``) guards ``/v1/*`` with ``Authorization: Bearer KEY``
  (401 otherwise); a request for more than ``--max-tokens`` or whose prompt plus
  completion exceeds ``--max-context-tokens`` is refused with 400, as the recipe's does.
- ``GET /healthz``; ``GET /readyz`` (503 until the serve port accepts; absent with
  ``--no-readyz``, as in older bridges); ``GET /v1/models``; ``POST /v1/chat/completions``
  (SSE with ``stream``; reasoning as ``reasoning_content`` only with top-level
  ``"thinking": true``; text only; no timings; ``usage`` when not streaming).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ONE_AT_A_TIME = threading.Lock()
SPACE = "▁"


class Tokenizer:
    def __init__(self, folder: Path) -> None:
        self.vocab: dict[str, int] = json.loads((folder / "vocab.json").read_text())
        self.pieces = {i: p for p, i in self.vocab.items()}

    def special(self, piece: str) -> int:
        return self.vocab[piece]

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for n, word in enumerate(text.split()):
            if n:
                ids.append(self.vocab[SPACE])
            if word in self.vocab:
                ids.append(self.vocab[word])
            else:
                ids += [self.vocab[f"<0x{b:02X}>"] for b in word.encode()]
        return ids


class Decoder:
    """Ids -> text as they arrive (bytes pieces wait until they form a character)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.pending = b""

    def feed(self, i: int) -> str:
        piece = self.tok.pieces.get(i, "")
        if piece.startswith("<0x") and len(piece) == 6:
            self.pending += bytes([int(piece[3:5], 16)])
            try:
                text, self.pending = self.pending.decode(), b""
            except UnicodeDecodeError:
                return ""
            return text
        if piece == SPACE:
            return " "
        if piece.startswith("<") and piece.endswith(">"):
            return ""  # special tokens are not text
        return piece


class Bridge:
    def __init__(self, a: argparse.Namespace) -> None:
        self.args = a
        self.tok = Tokenizer(Path(a.tokenizer_dir))
        self.template = Path(a.chat_template).read_text()
        self.engine = (a.engine_host, a.engine_port)

    def engine_up(self) -> bool:
        try:
            with socket.create_connection(self.engine, timeout=1):
                return True
        except OSError:
            return False

    def render(self, messages: list[dict[str, Any]], thinking: bool) -> list[int]:
        t = self.tok
        ids: list[int] = []
        for m in messages:
            role = str(m.get("role"))
            ids.append(t.special(f"<|im_{role}|>") if f"<|im_{role}|>" in t.vocab else 0)
            ids += t.encode(str(m.get("content") or ""))
            ids.append(t.special("<|im_end|>"))
        ids += [t.special("<|im_assistant|>"), t.special("<think>")]
        if not thinking:
            ids.append(t.special("</think>"))
        return ids


BRIDGE: Bridge


def kv(line: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in line.decode().strip().split(";"):
        k, _, v = part.partition("=")
        out[k] = v
    return out


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

    def _error(self, status: int, message: str, kind: str, code: str | None = None) -> None:
        """The bridge's OpenAI error envelope (``openai_error`` and its exception handler)."""
        detail = {"message": message, "type": kind, **({"code": code} if code else {})}
        self._json(status, {"error": detail})

    def _authorized(self) -> bool:
        """``_optional_bearer_auth``: with K3_API_KEY set, /v1/* needs ``Bearer KEY``;
        the health checks stay open."""
        key = BRIDGE.args.api_key
        if not key or not self.path.startswith("/v1/"):
            return True
        if self.headers.get("authorization") == f"Bearer {key}":
            return True
        self._error(401, "missing or invalid bearer token", "authentication_error",
                    "invalid_api_key")  # fmt: skip
        return False

    def do_GET(self) -> None:
        b = BRIDGE
        if not self._authorized():
            return
        if self.path == "/healthz":
            self._json(200, {"status": "ok"})
        elif self.path == "/readyz" and not b.args.no_readyz:
            if b.engine_up():
                self._json(200, {"status": "ready"})
            else:
                self._json(503, {"detail": "engine not ready"})
        elif self.path == "/v1/models":
            model = {"id": b.args.model, "object": "model", "created": 0, "owned_by": "sparkinfer"}
            self._json(200, {"object": "list", "data": [model]})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        b = BRIDGE
        if not self._authorized():
            return
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
        flat: list[dict[str, Any]] = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                if any(p.get("type") != "text" for p in content if isinstance(p, dict)):
                    self._json(400, {"detail": "image input is not supported (text only)"})
                    return
                content = " ".join(str(p.get("text", "")) for p in content)
            flat.append({"role": m.get("role"), "content": content})
        thinking = bool(body.get("thinking", False))
        prompt = b.render(flat, thinking)
        # requested_token_count / validate_request in the recipe's server.py: too many
        # tokens asked for, or prompt + completion beyond the context, is refused (400)
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        n = int(asked) if asked is not None else b.args.default_max_tokens
        limit = b.args.max_context_tokens
        if n > b.args.max_tokens:
            self._error(400, "requested completion exceeds server limit of "
                        f"{b.args.max_tokens} tokens", "invalid_request_error",
                        "max_tokens_exceeded")  # fmt: skip
            return
        if len(prompt) > limit:
            self._error(400, f"prompt exceeds server context limit of {limit} tokens",
                        "invalid_request_error", "context_length_exceeded")  # fmt: skip
            return
        if len(prompt) + n > limit:
            self._error(400, "prompt plus requested completion exceeds server context limit "
                        f"of {limit} tokens", "invalid_request_error",
                        "context_length_exceeded")  # fmt: skip
            return
        with ONE_AT_A_TIME:
            self._generate(prompt, n, thinking, bool(body.get("stream")))

    def _generate(self, prompt: list[int], n: int, thinking: bool, stream: bool) -> None:
        b = BRIDGE
        tok = b.tok
        stop = [tok.special("<|im_end|>")]
        end_think = tok.special("</think>")
        try:
            sock = socket.create_connection(b.engine, timeout=b.args.engine_timeout_s)
        except OSError as exc:
            self._json(503, {"detail": f"engine not reachable: {exc}"})
            return
        with sock:
            request = (
                f"prompt_ids={','.join(map(str, prompt))};n_predict={n};"
                f"stop_ids={','.join(map(str, stop))};stream={1 if stream else 0}\n"
            )
            sock.sendall(request.encode())
            reader = sock.makefile("rb")
            first = reader.readline()
            if not first.startswith(b"tok="):
                final = kv(first) if first else {"ok": "0", "error": "engine closed"}
                if final.get("ok") != "1":
                    self._json(502, {"detail": f"engine error: {final.get('error', '?')}"})
                    return
            cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
            created = int(time.time())
            decoder = Decoder(tok)
            in_reasoning = thinking

            def split(i: int) -> tuple[str, str]:
                """(kind, text) of one generated id: reasoning until </think>, then content."""
                nonlocal in_reasoning
                if i == end_think:
                    in_reasoning = False
                    return "", ""
                text = decoder.feed(i)
                return ("reasoning_content" if in_reasoning else "content"), text

            if not stream:
                final = kv(first)
                ids = [int(x) for x in final.get("generated_ids", "").split(",") if x]
                parts: dict[str, list[str]] = {"content": [], "reasoning_content": []}
                for i in ids:
                    kind, text = split(i)
                    if kind and text:
                        parts[kind].append(text)
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": "".join(parts["content"]).strip(),
                }
                if thinking:
                    message["reasoning_content"] = "".join(parts["reasoning_content"]).strip()
                finish = "length" if final.get("stop_reason") == "length" else "stop"
                self._json(
                    200,
                    {
                        "id": cid,
                        "object": "chat.completion",
                        "created": created,
                        "model": b.args.model,
                        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                        "usage": {
                            "prompt_tokens": len(prompt),
                            "completion_tokens": len(ids),
                            "total_tokens": len(prompt) + len(ids),
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
                    "model": b.args.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
                self.wfile.flush()

            chunk({"role": "assistant"})
            line = first
            while line.startswith(b"tok="):
                kind, text = split(int(line[4:].strip()))
                if kind and text:
                    chunk({kind: text})
                line = reader.readline()
            final = kv(line) if line else {}
            if final.get("ok") != "1":
                self.close_connection = True
                return  # the engine failed or died mid-answer: the stream just stops
            chunk({}, "length" if final.get("stop_reason") == "length" else "stop")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()


def main(argv: list[str]) -> int:
    global BRIDGE
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tokenizer-dir", required=True)
    p.add_argument("--chat-template", required=True)
    p.add_argument("--engine-host", required=True)
    p.add_argument("--engine-port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--default-max-tokens", type=int, required=True)
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--max-context-tokens", type=int, required=True)
    p.add_argument("--engine-timeout-s", type=float, required=True)
    p.add_argument("--api-key", default=os.environ.get("K3_API_KEY", ""))
    p.add_argument("--no-readyz", action="store_true", help="behave like a bridge without /readyz")
    a = p.parse_args(argv)
    try:
        BRIDGE = Bridge(a)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"error: cannot load the tokenizer or chat template: {exc}\n")
        return 1
    httpd = ThreadingHTTPServer((a.host, a.port), Handler)
    sys.stderr.write(
        f"INFO:     Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)\n"
    )
    sys.stderr.flush()
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
