"""Launch to first token: k3desk's serve path vs llama-server alone, on the tiny Kimi-K3.

    python bench/launch_to_first_token.py [--rounds 5] [--engine PATH] [--cli]

k3desk path, timed from nothing running: find the engine, probe it (cached after
the first run, as in the app), validate the shard set, plan, start it under the
supervisor (free port, fresh key, own session, log file), wait for /health 200,
then stream a chat request until its first token.
Bare path: spawn llama-server with the same arguments, poll /health every 10 ms,
stream the same request.  Both are reported (medians over --rounds, after one
warm-up round each) with the difference.  Goal: the k3desk path <= 1.5 s total.
With --cli the k3desk path is ``python -m k3desk serve`` in a subprocess instead
(Python start-up and imports included), timed until it prints the URL.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from k3desk.core.engines.discovery import find_llama_server
from k3desk.core.engines.ports import free_port
from k3desk.core.engines.probe import probe_engine
from k3desk.core.engines.supervisor import LaunchSpec, Supervisor
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.hardware.detect import detect_hardware
from k3desk.core.paths import default_paths
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.devtools.tinyk3 import write_tiny_k3

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 1.5
REQUEST = {
    "messages": [{"role": "user", "content": "Hello! Who are you?"}],
    "max_tokens": 16,
    "stream": True,
    "ignore_eos": True,  # random weights may pick end-of-message first
    "seed": 42,
    "chat_template_kwargs": {"thinking": False},
}


@dataclass
class Timing:
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, t0: float) -> None:
        self.marks[name] = time.perf_counter() - t0


def first_token(url: str, headers: dict[str, str]) -> None:
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", headers=headers, json=REQUEST, timeout=60
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and ('"content"' in line or '"reasoning_content"' in line):
                return
    raise RuntimeError("the stream ended without a token")


def k3desk_path(
    first: Path, mmproj: Path, engine: Path | None, home: Path
) -> tuple[Timing, tuple[str, ...]]:
    paths = default_paths({"K3DESK_HOME": str(home)})
    tm = Timing()
    t0 = time.perf_counter()
    exe = engine or find_llama_server(paths)
    if exe is None:
        raise SystemExit("no llama-server found (see `k3desk engine install`)")
    result = probe_engine(exe, paths)
    if not result.usable:
        raise SystemExit(result.verdict())
    tm.mark("engine found+probed", t0)
    layout = validate_shard_set(first)
    hw = detect_hardware(None, measure_bandwidth=False)
    plan = make_plan(hw, layout, PlanOptions(ctx=1024, mmproj=mmproj))
    tm.mark("validated+planned", t0)
    sup = Supervisor(
        LaunchSpec(exe, tuple(plan.server_args), model_bytes=layout.total_file_bytes), paths
    )
    sup.start()
    try:
        ep = sup.wait_ready(60)
        tm.mark("/health 200", t0)
        first_token(ep.url, ep.headers)
        tm.mark("first token", t0)
    finally:
        sup.stop()
    return tm, tuple(plan.server_args)


def cli_path(
    first: Path, mmproj: Path, engine: Path | None, home: Path
) -> tuple[Timing, tuple[str, ...]]:
    tm = Timing()
    env = {**os.environ, "K3DESK_HOME": str(home), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable,
        "-m",
        "k3desk",
        "serve",
        str(first),
        "--mmproj",
        str(mmproj),
        "--ctx",
        "1024",
    ]
    if engine:
        argv += ["--engine", str(engine)]
    t0 = time.perf_counter()
    with subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as p:
        assert p.stdout is not None
        url = key = ""
        for line in p.stdout:
            if line.startswith("URL: "):
                url = line.split(": ", 1)[1].strip().removesuffix("/v1")
                tm.mark("/health 200", t0)
            elif line.startswith("API key: "):
                key = line.split(": ", 1)[1].strip()
                break
        first_token(url, {"Authorization": f"Bearer {key}"})
        tm.mark("first token", t0)
        p.terminate()
        p.wait(30)
    return tm, ()


def bare_path(exe: Path, args: tuple[str, ...]) -> Timing:
    tm = Timing()
    port = free_port()
    t0 = time.perf_counter()
    with subprocess.Popen(
        [str(exe), *args, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as p:
        url = f"http://127.0.0.1:{port}"
        try:
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if p.poll() is not None:
                    raise RuntimeError("llama-server exited")
                time.sleep(0.01)
            tm.mark("/health 200", t0)
            first_token(url, {})
            tm.mark("first token", t0)
        finally:
            p.terminate()
            p.wait(30)
    return tm


def median(runs: list[Timing], key: str) -> float:
    return statistics.median(r.marks[key] for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--engine", type=Path)
    ap.add_argument("--cli", action="store_true", help="time `python -m k3desk serve` instead")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="k3bench-") as tmp:
        root = Path(tmp)
        model = write_tiny_k3(root / "model", shards=3, mmproj=True)
        assert model.mmproj is not None
        home = root / "home"
        path_fn = cli_path if a.cli else k3desk_path
        # warm-up (page cache, probe cache) - not counted
        cold, args = k3desk_path(model.first_part, model.mmproj, a.engine, home)
        exe = a.engine or find_llama_server(default_paths({"K3DESK_HOME": str(home)}))
        assert exe is not None
        bare_path(exe, args)
        ours, bare = [], []
        for _ in range(a.rounds):  # alternate, so load on the machine hits both alike
            ours.append(path_fn(model.first_part, model.mmproj, a.engine, home)[0])
            bare.append(bare_path(exe, args))
    label = "k3desk serve (CLI)" if a.cli else "k3desk (core)"
    print(f"tiny Kimi-K3, 3 shards + projector; {a.rounds} rounds, medians; engine {exe}")
    print(f"first round, cold probe included: first token at {cold.marks['first token']:.3f} s")
    if not a.cli:
        print(
            f"  {label}: engine+probe {median(ours, 'engine found+probed'):.3f} s, "
            f"+validate+plan {median(ours, 'validated+planned'):.3f} s"
        )
    for key in ("/health 200", "first token"):
        o, b = median(ours, key), median(bare, key)
        print(
            f"{key:>12}: {label} {o:.3f} s | llama-server alone {b:.3f} s | "
            f"difference {o - b:+.3f} s"
        )
    total = median(ours, "first token")
    verdict = "meets" if total <= GOAL_S else "misses"
    print(f"launch to first token {total:.3f} s {verdict} the {GOAL_S} s goal")
    return 0 if total <= GOAL_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
