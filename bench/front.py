"""The local API's front (``k3desk api serve``) against the router behind it: what it costs.

    python bench/front.py [--rounds 15] [--tokens 128] [--engine PATH]

``k3desk api serve`` runs llama-server's router on loopback at a port of its own and puts
k3desk's front (core/engines/front.py) at the local API's address.  One wide tiny Kimi-K3
is in My models; the first request loads it.  Then the OpenAI SDK streams the same
completion (``--tokens`` tokens, ``ignore_eos``, fixed seed) alternately

* through the front, at the local API's port, with a client key (as a tool is set up);
* straight to the router, at its own loopback port (read from its listening socket), with
  the same key;
* straight to the router again (the noise floor: the same path twice).

Both paths end in the same router and the same model instance, so the difference is the
front: it reads the head and the JSON body, checks the key, asks nothing of the router
while the model was seen loaded in the last second, and passes the bytes on.  Medians are
printed; goals as the local API's (issue "one local endpoint"): tokens/s >= 0.98x and
first token <= +5 ms.  The last line says ``front/router tokens/s = X``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import openai
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from endpoint import GOAL_ADDED_MS, GOAL_RATIO, k3desk, one_stream  # noqa: E402

from k3desk.core.engines.discovery import find_llama_server  # noqa: E402
from k3desk.core.engines.ports import free_port  # noqa: E402
from k3desk.core.paths import default_paths  # noqa: E402
from k3desk.devtools.tinyk3 import write_tiny_k3  # noqa: E402


def start_api_serve(home: Path, engine: Path) -> tuple[subprocess.Popen[str], int]:
    """``k3desk api serve`` until its router is ready: the process and the router's pid."""
    env = {**os.environ, "K3DESK_HOME": str(home), "PYTHONPATH": str(REPO),
           "K3DESK_LLAMA_SERVER": str(engine)}  # fmt: skip
    env.pop("K3DESK_API_PORT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "k3desk", "api", "serve"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("Engine pid: "):
            return proc, int(line.removeprefix("Engine pid: "))
    raise SystemExit("k3desk api serve did not get ready")


def listening_port(pid: int) -> int:
    for conn in psutil.Process(pid).net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr:
            return int(conn.laddr.port)
    raise SystemExit(f"the router (pid {pid}) listens nowhere")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--engine", type=Path, help="llama-server (default: the one found)")
    args = parser.parse_args()
    engine = args.engine or find_llama_server(default_paths())
    if engine is None:
        raise SystemExit("No llama-server found: pass --engine PATH.")
    with tempfile.TemporaryDirectory(prefix="k3desk-bench-front-") as tmp:
        work = Path(tmp)
        home = work / "home"
        model = write_tiny_k3(work / "model", shards=1, mmproj=False, wide=True, name="Tiny")
        port = free_port()
        k3desk(home, "api", "port", str(port))
        key = k3desk(home, "api", "create", "tool").stdout.split()[0]
        k3desk(home, "models", "add", str(model.first_part))
        serve, router_pid = start_api_serve(home, engine)
        router_port = listening_port(router_pid)
        urls = {"front": port, "router": router_port, "router-again": router_port}
        clients = {
            name: openai.OpenAI(base_url=f"http://127.0.0.1:{p}/v1", api_key=key, max_retries=0)
            for name, p in urls.items()
        }
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in clients}
        try:
            for client in clients.values():  # warm-up (the first one loads the model)
                one_stream(client, args.tokens, model="Tiny")
            for _ in range(args.rounds):
                for name, client in clients.items():
                    results[name].append(one_stream(client, args.tokens, model="Tiny"))
        finally:
            for client in clients.values():
                client.close()
            serve.terminate()
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
    print(f"{args.rounds} rounds of {args.tokens} tokens, alternating")
    for name, (ttft, tps, whole) in med.items():
        print(
            f"  {name:<12} first token {ttft:7.2f} ms   {tps:8.1f} tokens/s after it   "
            f"{whole:8.1f} over the whole answer"
        )
    floor = med["router-again"][1] / med["router"][1]
    print(
        f"noise floor: router-again/router tokens/s = {floor:.3f}, first token "
        f"{med['router-again'][0] - med['router'][0]:+.2f} ms (the same path twice)"
    )
    ratio = med["front"][1] / med["router"][1]
    whole = med["front"][2] / med["router"][2]
    added = med["front"][0] - med["router"][0]
    ok = ratio >= GOAL_RATIO and whole >= GOAL_RATIO and added <= GOAL_ADDED_MS
    print(f"added first-token latency = {added:+.2f} ms (goal <= {GOAL_ADDED_MS:g} ms)")
    print(f"front/router tokens/s over the whole answer = {whole:.3f} (goal >= {GOAL_RATIO})")
    print(f"front/router tokens/s = {ratio:.3f} (goal >= {GOAL_RATIO}) {'met' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
