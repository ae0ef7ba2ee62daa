"""Kimi-K3 at its real size: k3desk serve + chat vs llama-server alone, same arguments, same run.

    python bench/real_scale.py [--tier grearl-iq1s] [--dir DIR] [--engine PATH]

Writes a sparse twin of the tier (528 GiB apparent for GrEarl's 94-part IQ1_S, a few
MB on disk) and times, from nothing running to the first generated token:

* **llama-server alone**: the arguments k3desk's plan gives (``--no-repack``, mmap, no
  GPU flags on a machine without one) plus ``--host/--port``, /health polled, one
  streamed chat request of ``max_tokens`` 1;
* **k3desk**: ``k3desk serve SHARD --accept-slow`` (validation, engine probe, plan,
  supervision, load progress) until it prints the URL, then ``k3desk chat --url``
  with the same question until its answer (one token) ends.

For each it samples every 0.5 s the peak RSS of the engine (file-backed pages of the
mmap'd shards included) and of k3desk's own processes (serve and chat, without the
engine).  Goal: k3desk's time within 5 % of llama-server's, its own processes at most
256 MiB.  Prints the load average: on a shared 2-core machine the times are noisy.
A real-size run fills the page cache: run it rarely.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from k3desk.core.app.launch import LocalLaunchRequest, prepare_local_launch
from k3desk.core.app.services import Services
from k3desk.core.catalog.loader import load_catalog
from k3desk.core.engines.discovery import find_llama_server
from k3desk.core.engines.ports import free_port
from k3desk.core.paths import default_paths
from k3desk.core.resources import resources_dir
from k3desk.core.units import MiB, fmt_bytes
from k3desk.devtools.twin import write_twin

REPO = Path(__file__).resolve().parents[1]
GOAL_RATIO = 1.05
GOAL_OWN_RSS = 256 * MiB
QUESTION = "Hi"


class PeakRss:
    """Peak RSS of the processes ``pick`` returns, sampled every 0.5 s in a thread."""

    def __init__(self, pick: object) -> None:
        self.pick = pick
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            total = 0
            for p in self.pick():  # type: ignore[operator]
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _alive(*procs: psutil.Process) -> list[psutil.Process]:
    return [p for p in procs if p.is_running()]


def bare(engine: Path, args: tuple[str, ...]) -> tuple[float, int]:
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [str(engine), *args, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    engine_p = psutil.Process(proc.pid)
    rss = PeakRss(lambda: _alive(engine_p))
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited {proc.returncode} while loading")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 1,
                "seed": 1, "stream": True}  # fmt: skip
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=None) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    break
        took = time.perf_counter() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return took, rss.stop()


def k3desk(shard: Path, engine: Path) -> tuple[float, int, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    serve = subprocess.Popen(
        [sys.executable, "-m", "k3desk", "serve", str(shard), "--engine", str(engine),
         "--accept-slow"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    serve_p = psutil.Process(serve.pid)
    own: list[psutil.Process] = [serve_p]

    def engine_procs() -> list[psutil.Process]:
        try:
            return [c for c in serve_p.children(recursive=True) if "llama-server" in c.name()]
        except psutil.Error:
            return []

    own_rss = PeakRss(lambda: _alive(*own))
    engine_rss = PeakRss(engine_procs)
    try:
        assert serve.stdout is not None
        text = ""
        while "Press Ctrl-C" not in text:
            line = serve.stdout.readline()
            if not line:
                raise SystemExit("k3desk serve ended:\n" + text)
            text += line
        url = re.search(r"^URL: (\S+)", text, re.M)
        key = re.search(r"^API key: (\S+)", text, re.M)
        assert url is not None
        assert key is not None
        chat = subprocess.Popen(
            [sys.executable, "-m", "k3desk", "chat", "--url", url.group(1),
             f"--api-key={key.group(1)}", "--max-tokens", "1", "--seed", "1", QUESTION],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        own.append(psutil.Process(chat.pid))
        _out, err = chat.communicate()
        took = time.perf_counter() - t0
        if chat.returncode != 0:
            raise SystemExit(f"k3desk chat failed: {err}")
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(60)
    return took, own_rss.stop(), engine_rss.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tier", default="grearl-iq1s")
    ap.add_argument("--dir", type=Path, help="where to write the twin (default: a temp dir)")
    ap.add_argument("--engine", type=Path, help="llama-server (default: the one k3desk finds)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    engine = a.engine or find_llama_server(default_paths())
    if engine is None:
        raise SystemExit("no llama-server found: pass --engine")
    tier = load_catalog(resources_dir() / "catalog.json").get(a.tier)
    with tempfile.TemporaryDirectory(prefix="k3-real-") as tmp:
        os.environ.setdefault("K3DESK_HOME", str(Path(tmp) / "home"))
        parts = write_twin(tier, a.dir or Path(tmp) / a.tier)
        shard = parts[0]
        launch = prepare_local_launch(
            Services(), LocalLaunchRequest(shard, engine=engine, accept_slow=True)
        )
        args = launch.prepared.spec().args
        print(f"{tier.name}: {len(parts)} parts, {fmt_bytes(sum(p.stat().st_size for p in parts))}"
              f"; plan: {launch.plan.verdict}, {' '.join(args[2:])}", flush=True)  # fmt: skip
        load0 = os.getloadavg()
        bare_s, bare_rss = bare(engine, args)
        print(f"llama-server alone: first token after {bare_s:.1f} s, peak RSS "
              f"{fmt_bytes(bare_rss)}", flush=True)  # fmt: skip
        k3_s, own_rss, eng_rss = k3desk(shard, engine)
        load1 = os.getloadavg()
    ratio = k3_s / bare_s
    print(f"k3desk serve + chat: first token after {k3_s:.1f} s ({ratio:.3f}x llama-server "
          f"alone; goal <= {GOAL_RATIO}), k3desk's own processes peak {fmt_bytes(own_rss)} "
          f"(goal <= {fmt_bytes(GOAL_OWN_RSS)}), its engine {fmt_bytes(eng_rss)}")  # fmt: skip
    print(f"load average: {load0[0]:.1f} before, {load1[0]:.1f} after (2 cores; shared)")
    predicted = launch.plan.load_seconds
    print(f"predicted load: {predicted:.0f} s at {3.5:.1f} GB/s; predicted "
          f"{1 / launch.plan.speed.expected_tps:.0f} s per token")  # fmt: skip
    if a.json:
        print(json.dumps({"bare_s": bare_s, "k3desk_s": k3_s, "ratio": ratio,
                          "own_rss": own_rss, "engine_rss": eng_rss, "bare_rss": bare_rss,
                          "load": [load0[0], load1[0]]}))  # fmt: skip
    return 0 if ratio <= GOAL_RATIO and own_rss <= GOAL_OWN_RSS else 1


if __name__ == "__main__":
    sys.exit(main())
