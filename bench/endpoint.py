"""The local API against llama-server alone: what k3desk's endpoint costs a tool.

    python bench/endpoint.py [--rounds 15] [--tokens 128] [--keys 20] [--engine PATH]

Both sides run the real llama-server on the tiny Kimi-K3 with the same model arguments:

* endpoint: ``k3desk serve`` in a throw-away home, on the local API's fixed port (its
  front there, the engine behind it on loopback), with
  ``--keys`` client keys made by ``k3desk api create`` (the engine checks each request
  against all of them), the CORS limits, the app's own key; the client is the OpenAI SDK
  with one of those client keys, as a person's tool would be set up;
* bare: llama-server started by hand with the arguments ``k3desk serve`` printed, on a
  free port, no key, in a session of its own (as k3desk's engine, and one started in a
  terminal, run: see ``start_bare``).

Rounds alternate between the two (one warm-up each first); each round streams one
completion (the completions route) of ``--tokens`` tokens (``ignore_eos``, fixed seed) and
times the first token, the tokens after it, and the whole answer from the request on (which
a relay holding tokens back to send them together cannot flatter).  Medians are printed,
then the ratio of the endpoint's tokens/s to the bare engine's and the first-token time it
adds, beside the same figures for a second bare engine (the noise floor: two identical
engines on this machine).  Goals: ratios >= 0.98, added first-token latency <= 5 ms.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from k3desk.core.engines.discovery import find_llama_server  # noqa: E402
from k3desk.core.engines.ports import free_port  # noqa: E402
from k3desk.core.paths import default_paths  # noqa: E402
from k3desk.devtools.tinyk3 import write_tiny_k3  # noqa: E402

GOAL_RATIO = 0.98
GOAL_ADDED_MS = 5.0


def k3desk(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "K3DESK_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("K3DESK_API_PORT", None)
    return subprocess.run(
        [sys.executable, "-m", "k3desk", *args],
        env=env, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip


def start_serve(home: Path, shard: Path, engine: Path) -> tuple[subprocess.Popen[str], str]:
    """``k3desk serve`` until ready: the process and the model arguments it printed."""
    env = {**os.environ, "K3DESK_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("K3DESK_API_PORT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "k3desk", "serve", str(shard), "--ctx", "2048",
         "--engine", str(engine)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    args = ""
    for line in proc.stdout:
        if line.startswith("Arguments: "):
            args = line.removeprefix("Arguments: ").strip()
        if line.startswith("Engine pid: "):
            return proc, args
    raise SystemExit("k3desk serve did not get ready")


def start_bare(engine: Path, args: str, port: int) -> subprocess.Popen[bytes]:
    # a session of its own, as the engine k3desk starts has and as one a person starts in a
    # terminal would: with the kernel's autogroup scheduling (sched_autogroup_enabled) an
    # engine sharing this client's session got its first token 6-15 ms sooner here, a
    # difference of where it runs, not of what serves it
    proc = subprocess.Popen(
        [str(engine), *shlex.split(args), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise SystemExit("the bare llama-server did not get ready")


def one_stream(
    client: openai.OpenAI, tokens: int, model: str = "kimi-k3"
) -> tuple[float, float, float]:
    """(seconds to the first token, tokens per second after it, tokens per second over the
    whole answer from the request on) of one streamed answer.  The last one is what a relay
    that holds pieces back to send them together cannot make look better than it is."""
    started = time.perf_counter()
    first = 0.0
    count = 0
    # the completions route: a random model's long answer can look like a malformed tool
    # call to Kimi-K3's chat parser, which would end the stream with an error
    stream = client.completions.create(
        model=model,
        prompt="Once upon a time",
        max_tokens=tokens,
        stream=True,
        extra_body={"ignore_eos": True, "seed": 42, "temperature": 0.0},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            count += 1
            if not first:
                first = time.perf_counter()
    end = time.perf_counter()
    after = (count - 1) / (end - first) if count > 1 else 0.0
    return first - started, after, count / (end - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--keys", type=int, default=20, help="client keys the engine checks")
    parser.add_argument("--engine", type=Path, help="llama-server (default: the one found)")
    args = parser.parse_args()
    engine = args.engine or find_llama_server(default_paths())
    if engine is None:
        raise SystemExit("No llama-server found: pass --engine PATH.")
    with tempfile.TemporaryDirectory(prefix="k3desk-bench-endpoint-") as tmp:
        work = Path(tmp)
        home = work / "home"
        # the wide tiny model: decode, not the client, bounds its tokens/s
        model = write_tiny_k3(work / "model", shards=1, mmproj=False, wide=True)
        port = free_port()
        k3desk(home, "api", "port", str(port))
        keys = [
            k3desk(home, "api", "create", f"tool-{n}").stdout.split()[0] for n in range(args.keys)
        ]
        serve, model_args = start_serve(home, model.first_part, engine)
        bare_port, twin_port = free_port(), free_port()
        bare = start_bare(engine, model_args, bare_port)
        twin = start_bare(engine, model_args, twin_port)
        clients = {
            "endpoint": openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key=keys[-1], max_retries=0
            ),
            "bare": openai.OpenAI(
                base_url=f"http://127.0.0.1:{bare_port}/v1", api_key="none", max_retries=0
            ),
            # a second bare engine: what two identical engines differ by on this machine
            "bare-twin": openai.OpenAI(
                base_url=f"http://127.0.0.1:{twin_port}/v1", api_key="none", max_retries=0
            ),
        }
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in clients}
        try:
            for client in clients.values():  # warm-up
                one_stream(client, args.tokens)
            for _ in range(args.rounds):
                for name, client in clients.items():
                    results[name].append(one_stream(client, args.tokens))
        finally:
            for client in clients.values():
                client.close()
            bare.terminate()
            twin.terminate()
            serve.terminate()
            bare.wait(30)
            twin.wait(30)
            serve.wait(30)
    med = {
        name: (
            statistics.median(r[0] for r in rows) * 1000,
            statistics.median(r[1] for r in rows),
            statistics.median(r[2] for r in rows),
        )
        for name, rows in results.items()
    }
    print(f"llama-server: {engine}")
    print(f"{args.rounds} rounds of {args.tokens} tokens, alternating; {args.keys} client keys")
    for name, (ttft, tps, whole) in med.items():
        print(
            f"  {name:<9} first token {ttft:7.2f} ms   {tps:8.1f} tokens/s after it   "
            f"{whole:8.1f} over the whole answer"
        )
    floor = med["bare-twin"][1] / med["bare"][1]
    print(
        f"noise floor: bare-twin/bare tokens/s = {floor:.3f}, first token "
        f"{med['bare-twin'][0] - med['bare'][0]:+.2f} ms (the same engine twice)"
    )
    ratio = med["endpoint"][1] / med["bare"][1]
    whole = med["endpoint"][2] / med["bare"][2]
    added = med["endpoint"][0] - med["bare"][0]
    ok = ratio >= GOAL_RATIO and whole >= GOAL_RATIO and added <= GOAL_ADDED_MS
    print(f"added first-token latency = {added:+.2f} ms (goal <= {GOAL_ADDED_MS:g} ms)")
    print(f"endpoint/bare tokens/s over the whole answer = {whole:.3f} (goal >= {GOAL_RATIO})")
    print(
        f"endpoint/bare tokens/s = {ratio:.3f} (goal >= {GOAL_RATIO}) {'met' if ok else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
