#!/usr/bin/env python3
"""Stand-in for the recipe's FastAPI bridge ``api-server/server.py`` (stdlib http.server).

It keeps the real bridge's contract (vcruz305/kimi-k3-neuron-tp3-dgxspark-recipe,
``api-server/server.py``, read for this file), function by function:

    server.py --host H --port P --tokenizer-dir DIR --chat-template FILE
              --engine-host H --engine-port P --model NAME --default-max-tokens N
              --max-tokens N --max-context-tokens N --engine-timeout-s S [--api-key KEY]
              [--no-readyz]

(started by ``run-api.sh``, which fills these from the K3_* environment; ``K3_API_KEY``
is read from the environment, as the real one does).

- ``GET /healthz`` -> ``{"ok", "model", "vocab_size"}``; ``GET /readyz`` -> ``{"ok": true,
  "model", "engine": "H:P"}``, or 503 ``not_ready`` until rank 0's serve port accepts
  (absent with ``--no-readyz``, as in older bridges); both open without the key.
- ``/v1/*`` needs ``Authorization: Bearer K3_API_KEY`` when a key is set: else 401
  ``{"error": {"message": "missing or invalid bearer token", "type":
  "authentication_error", "code": "invalid_api_key"}}``.
- ``GET /v1/models`` -> one model, ``owned_by: "local"``.
- ``POST /v1/chat/completions``: the prompt is the chat template's rendering with the
  top-level ``thinking`` (default false; ``chat_template_kwargs`` is ignored, as pydantic
  drops unknown fields) ending in ``<|open|>think<|sep|>`` or ``<|open|>response<|sep|>``;
  text parts only; then validate_request: the model name (404 ``model_not_found``),
  ``n == 1``, ``max_tokens``/``max_completion_tokens`` (default K3_DEFAULT_MAX_TOKENS; over
  K3_MAX_TOKENS: 400 ``max_tokens_exceeded``), prompt and prompt + answer within
  K3_MAX_CONTEXT_TOKENS (400 ``context_length_exceeded``).  Errors are
  ``{"error": {"message", "type", "code"}}``; malformed bodies 400.  ``temperature``,
  ``top_p``, ``stop``, ``seed``, ``stream_options`` are accepted or dropped, never used.
- The answer: generated ids decoded with the special tokens as text, split by
  ``extract_reply_text`` (reasoning until ``<|close|>think<|sep|><|open|>response<|sep|>``,
  cut at the next ``<|close|>``).  Streaming re-decodes the whole answer so far at every
  token and sends what is new, holding back a margin of 4 tokens; deltas carry
  ``content`` or ``reasoning_content``; no ``usage`` and no timings; an engine failure
  after the stream began is one ``data: {"error": ...}`` event, then ``[DONE]``.
  Without streaming, ``usage`` is there.
- Rank 0's serve socket: one connection per request, one line
  ``prompt_ids=..;n_predict=N;stop_ids=..;stream=0|1``; ``tok=ID`` lines back while
  streaming; a final ``ok=1;generated_ids=..;stop_reason=stop|length`` or ``ok=0;error=..``.
  Requests go one at a time.  Stop ids: ``generation_config.json``'s ``eos_token_id``
  and the tokenizer's eos.

Like the real one it loads ``transformers.AutoTokenizer`` from the tokenizer folder at
start (so it needs transformers in its Python) and renders every request with
``apply_chat_template(..., chat_template=K3_CHAT_TEMPLATE, add_generation_prompt=True,
thinking=..., tokenize=True)``, refusing it when that is not a token-id list (as with
transformers 5.x).  The ids it sends rank 0 come from the stand-ins' own tokenizer,
``DIR/vocab.json`` (see tests/fakes/sparkinfer/stand_in.py): the special tokens and listed
words are pieces of their own, other words their UTF-8 bytes as ``<0xNN>`` pieces, ``▁``
between words; rank 0's stand-in reads the same file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
SPECIAL_RE = re.compile(r"(<\|[a-z_]+\|>|\[[A-Z]+\])")
_THINK_TO_RESPONSE = "<|close|>think<|sep|><|open|>response<|sep|>"
_ANY_CLOSE = "<|close|>"


class HTTPError(Exception):
    def __init__(self, status: int, message: str, etype: str = "invalid_request_error",
                 code: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.detail: dict[str, Any] = {"message": message, "type": etype}
        if code is not None:
            self.detail["code"] = code


class Tokenizer:
    def __init__(self, folder: Path) -> None:
        self.vocab: dict[str, int] = json.loads((folder / "vocab.json").read_text())
        self.pieces = {i: p for p, i in self.vocab.items()}
        self.eos_token_id = self.vocab["[EOS]"]

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in SPECIAL_RE.split(text):
            if not part:
                continue
            if part in self.vocab and SPECIAL_RE.fullmatch(part):
                ids.append(self.vocab[part])
                continue
            for n, word in enumerate(part.split(" ")):
                if n:
                    ids.append(self.vocab[SPACE])
                if not word:
                    continue
                if word in self.vocab:
                    ids.append(self.vocab[word])
                else:
                    ids += [self.vocab[f"<0x{b:02X}>"] for b in word.encode()]
        return ids

    def decode(self, ids: list[int]) -> str:
        """skip_special_tokens=False: control tokens come out as their text."""
        out: list[str] = []
        pending = b""
        for i in ids:
            piece = self.pieces.get(i, "")
            if piece.startswith("<0x") and len(piece) == 6:
                pending += bytes([int(piece[3:5], 16)])
                continue
            if pending:
                out.append(pending.decode("utf-8", "replace"))
                pending = b""
            out.append(" " if piece == SPACE else piece)
        if pending:
            out.append(pending.decode("utf-8", "replace"))
        return "".join(out)

    def render(self, messages: list[dict[str, Any]], thinking: bool) -> list[int]:
        """What the chat template (stand_in.TEMPLATE) renders, tokenized."""
        text = ""
        for m in messages:
            text += (f'<|open|>message role="{m["role"]}"<|sep|>{m.get("content") or ""}'
                     "<|close|>message<|sep|><|end_of_msg|>")  # fmt: skip
        text += '<|open|>message role="assistant"<|sep|>'
        text += "<|open|>think<|sep|>" if thinking else "<|open|>response<|sep|>"
        return self.encode(text)


def extract_reply_text(raw: str, thinking: bool) -> tuple[str, str | None]:
    """server.py's extract_reply_text, as it is."""
    if thinking:
        idx = raw.find(_THINK_TO_RESPONSE)
        if idx >= 0:
            reasoning = raw[:idx].strip()
            rest = raw[idx + len(_THINK_TO_RESPONSE):]
            end = rest.find(_ANY_CLOSE)
            content = (rest[:end] if end >= 0 else rest).strip()
            return content, reasoning
        end = raw.find(_ANY_CLOSE)
        return "", (raw[:end] if end >= 0 else raw).strip()
    end = raw.find(_ANY_CLOSE)
    return (raw[:end] if end >= 0 else raw).strip(), None


def kv(line: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for field in line.split(";"):
        if not field or "=" not in field:
            continue
        k, v = field.split("=", 1)
        out[k] = v
    return out


class Bridge:
    def __init__(self, a: argparse.Namespace) -> None:
        self.args = a
        if (a.default_max_tokens < 0 or a.max_tokens < 0 or a.max_context_tokens <= 0
                or a.engine_timeout_s <= 0):  # fmt: skip
            raise ValueError("K3 token limits must be non-negative (context must be positive)")
        if a.default_max_tokens > a.max_tokens:
            raise ValueError("K3_DEFAULT_MAX_TOKENS cannot exceed K3_MAX_TOKENS")
        folder = Path(a.tokenizer_dir)
        from transformers import AutoTokenizer  # server.py imports it at the top

        self.hf = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)
        self.tok = Tokenizer(folder)
        self.template = Path(a.chat_template).read_text()
        self.engine = (a.engine_host, a.engine_port)
        stop = {self.tok.eos_token_id}
        gen_cfg = folder / "generation_config.json"
        if gen_cfg.exists():
            eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
            if isinstance(eos, list):
                stop.update(int(x) for x in eos)
            elif eos is not None:
                stop.add(int(eos))
        self.stop_ids = stop

    def engine_request(self, prompt: list[int], n: int, stream: bool,
                       on_token: Any = None) -> dict[str, str]:  # fmt: skip
        """One request on rank 0's serve socket; 503/502 as engine_request() raises them."""
        line = (f"prompt_ids={','.join(map(str, prompt))};n_predict={n};"
                f"stop_ids={','.join(map(str, sorted(self.stop_ids)))};"
                f"stream={1 if stream else 0}\n")  # fmt: skip
        try:
            with ONE_AT_A_TIME, socket.create_connection(
                self.engine, timeout=self.args.engine_timeout_s
            ) as sock:
                sock.sendall(line.encode())
                reader = sock.makefile("rb")
                while True:
                    raw = reader.readline()
                    if not raw:
                        raise OSError("SparkInfer serve socket closed unexpectedly")
                    text = raw.decode("utf-8", "replace").strip()
                    if text.startswith("tok="):
                        if on_token is not None:
                            on_token(int(text[4:]))
                        continue
                    result = kv(text)
                    if not result:
                        raise OSError("SparkInfer emitted an empty response line")
                    break
        except OSError as e:
            raise HTTPError(503, f"SparkInfer engine is unavailable: {e}", "server_error",
                            "engine_unavailable") from None  # fmt: skip
        if result.get("ok") != "1":
            raise HTTPError(502, f"SparkInfer engine error: {result.get('error', 'malformed')}",
                            "server_error", "engine_error")  # fmt: skip
        return result


BRIDGE: Bridge


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

    def _error(self, e: HTTPError) -> None:
        self._json(e.status, {"error": e.detail})

    def _authorized(self) -> bool:
        key = BRIDGE.args.api_key
        if (key and self.path.startswith("/v1/")
                and self.headers.get("authorization") != f"Bearer {key}"):  # fmt: skip
            self._json(401, {"error": {"message": "missing or invalid bearer token",
                                       "type": "authentication_error",
                                       "code": "invalid_api_key"}})  # fmt: skip
            return False
        return True

    def do_GET(self) -> None:
        b = BRIDGE
        if not self._authorized():
            return
        if self.path == "/healthz":
            self._json(200, {"ok": True, "model": b.args.model, "vocab_size": len(b.tok)})
        elif self.path == "/readyz" and not b.args.no_readyz:
            try:
                with socket.create_connection(b.engine, timeout=1):
                    pass
            except OSError as e:
                self._error(HTTPError(503, f"SparkInfer engine is not reachable: {e}",
                                      "server_error", "not_ready"))  # fmt: skip
                return
            self._json(200, {"ok": True, "model": b.args.model,
                             "engine": f"{b.engine[0]}:{b.engine[1]}"})  # fmt: skip
        elif self.path == "/v1/models":
            model = {"id": b.args.model, "object": "model", "owned_by": "local"}
            self._json(200, {"object": "list", "data": [model]})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        if self.path != "/v1/chat/completions":
            self._json(404, {"detail": "Not Found"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            req = parse_request(body)
        except HTTPError as e:
            self._error(e)
            return
        except (ValueError, TypeError):
            self._error(HTTPError(400, "invalid request body: JSON decode error",
                                  code="invalid_request"))  # fmt: skip
            return
        try:
            prompt = prompt_ids_for_request(req)
        except ValueError as e:
            self._error(HTTPError(400, f"prompt rendering/tokenize failed: {e}",
                                  code="invalid_request"))  # fmt: skip
            return
        try:
            n_predict = validate_request(req, prompt)
        except HTTPError as e:
            self._error(e)
            return
        if req["stream"]:
            self._stream(req, prompt, n_predict)
        else:
            self._complete(req, prompt, n_predict)

    def _complete(self, req: dict[str, Any], prompt: list[int], n: int) -> None:
        b = BRIDGE
        try:
            result = b.engine_request(prompt, n, stream=False)
        except HTTPError as e:
            self._error(e)
            return
        ids = [int(x) for x in result.get("generated_ids", "").split(",") if x != ""]
        content, reasoning = extract_reply_text(b.tok.decode(ids), req["thinking"])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        self._json(200, {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": req["model"],
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "stop" if result.get("stop_reason") == "stop"
                         else "length"}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                      "total_tokens": len(prompt) + len(ids)},
        })  # fmt: skip

    def _stream(self, req: dict[str, Any], prompt: list[int], n: int) -> None:
        b = BRIDGE
        thinking = req["thinking"]
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.end_headers()
        self.close_connection = True

        gone = [False]

        def event(obj: Any) -> None:
            # the client hung up: the engine still generates to the end (the real bridge's
            # request runs in an executor thread, holding the one-at-a-time lock)
            if gone[0]:
                return
            try:
                self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
                self.wfile.flush()
            except OSError:
                gone[0] = True

        def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
            event({"id": cid, "object": "chat.completion.chunk", "created": created,
                   "model": req["model"],
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})  # fmt: skip

        chunk({"role": "assistant"})
        token_ids: list[int] = []
        flushed = {"content": "", "reasoning": ""}
        margin = 4

        def flush(up_to: int) -> None:
            content, reasoning = extract_reply_text(b.tok.decode(token_ids[:up_to]), thinking)
            reasoning = reasoning or ""
            if reasoning.startswith(flushed["reasoning"]) and len(reasoning) > len(
                flushed["reasoning"]
            ):
                chunk({"reasoning_content": reasoning[len(flushed["reasoning"]):]})
                flushed["reasoning"] = reasoning
            if content.startswith(flushed["content"]) and len(content) > len(flushed["content"]):
                chunk({"content": content[len(flushed["content"]):]})
                flushed["content"] = content

        def on_token(tok: int) -> None:
            token_ids.append(tok)
            if len(token_ids) > margin:
                flush(len(token_ids) - margin)

        try:
            result = b.engine_request(prompt, n, stream=True, on_token=on_token)
        except HTTPError as e:
            event({"error": e.detail})
            event_done(gone, self.wfile)
            return
        flush(len(token_ids))
        chunk({}, "stop" if result.get("stop_reason") == "stop" else "length")
        event_done(gone, self.wfile)


def event_done(gone: list[bool], wfile: Any) -> None:
    if gone[0]:
        return
    try:
        wfile.write(b"data: [DONE]\n\n")
        wfile.flush()
    except OSError:
        pass


def parse_request(body: Any) -> dict[str, Any]:
    """ChatCompletionRequest's fields and checks (pydantic: unknown fields dropped)."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise HTTPError(400, "invalid request body: Field required", code="invalid_request")
    for name in ("max_tokens", "max_completion_tokens"):
        v = body.get(name)
        if v is not None and (not isinstance(v, int) or v < 1):
            raise HTTPError(400, "invalid request body: Input should be greater than or "
                            "equal to 1", code="invalid_request")  # fmt: skip
    return {
        "model": body.get("model", BRIDGE.args.model),
        "messages": body["messages"],
        "stream": bool(body.get("stream", False)),
        "max_tokens": body.get("max_tokens"),
        "max_completion_tokens": body.get("max_completion_tokens"),
        "n": body.get("n", 1),
        "thinking": bool(body.get("thinking")),  # req.thinking or False
    }


def prompt_ids_for_request(req: dict[str, Any]) -> list[int]:
    messages = []
    for msg in req["messages"]:
        content = msg.get("content")
        if isinstance(content, list):
            text_parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type", "text") != "text":
                    raise ValueError("only text message content is supported")
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError("text content parts require a string 'text' field")
                text_parts.append(text)
            content = "".join(text_parts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ValueError("message content must be a string or text-part array")
        messages.append({"role": msg.get("role"), "content": content})
    ids = BRIDGE.hf.apply_chat_template(
        messages, chat_template=BRIDGE.template, add_generation_prompt=True,
        thinking=req["thinking"], tokenize=True,
    )  # fmt: skip
    if not isinstance(ids, list) or not all(isinstance(token, int) for token in ids):
        raise ValueError("tokenizer did not return a token-id list")
    return BRIDGE.tok.render(messages, req["thinking"])  # the stand-in engine's own ids


def validate_request(req: dict[str, Any], prompt: list[int]) -> int:
    a = BRIDGE.args
    if req["model"] != a.model:
        raise HTTPError(404, f"model '{req['model']}' is not served here",
                        "invalid_request_error", "model_not_found")  # fmt: skip
    if req["n"] != 1:
        raise HTTPError(400, "only n=1 is supported by this sequential engine",
                        code="unsupported_value")  # fmt: skip
    mt, mct = req["max_tokens"], req["max_completion_tokens"]
    if mt is not None and mct is not None and mt != mct:
        raise HTTPError(400, "max_tokens and max_completion_tokens disagree",
                        code="invalid_request")  # fmt: skip
    n = mct if mct is not None else mt
    if n is None:
        n = a.default_max_tokens
    if n > a.max_tokens:
        raise HTTPError(400, f"requested completion exceeds server limit of {a.max_tokens} "
                        "tokens", code="max_tokens_exceeded")  # fmt: skip
    ctx = a.max_context_tokens
    if len(prompt) > ctx:
        raise HTTPError(400, f"prompt exceeds server context limit of {ctx} tokens",
                        code="context_length_exceeded")  # fmt: skip
    if len(prompt) + n > ctx:
        raise HTTPError(400, "prompt plus requested completion exceeds server context limit "
                        f"of {ctx} tokens", code="context_length_exceeded")  # fmt: skip
    return n


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
    except Exception as exc:  # noqa: BLE001  (as uvicorn's failed startup: the reason, exit 1)
        sys.stderr.write(f"ERROR:    {type(exc).__name__}: {exc}\n")
        return 1
    httpd = ThreadingHTTPServer((a.host, a.port), Handler)
    sys.stderr.write(
        f"[api-server] ready model={a.model} vocab_size={len(BRIDGE.tok)} "
        f"engine={a.engine_host}:{a.engine_port} stop_ids={sorted(BRIDGE.stop_ids)}\n"
        f"INFO:     Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)\n"
    )
    sys.stderr.flush()
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
