"""The SparkInfer stand-ins run on this machine without SSH: a TP3 rank 0 and its two
workers, and the recipe's bridge in front of rank 0, started the way the recipe's
QUICKSTART starts them (``kimi_k3_dist_generate --rank R ... --serve``, then
``api-server/run-api.sh`` with the K3_* environment).  For tests of what a client sees
of an attached bridge.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.core.cluster.twin import write_recipe_twin
from tests.fakes.sparkinfer.stand_in import install_recipe, write_model_extras

FAKES = Path(__file__).resolve().parent


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (32768 by default)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii")
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(taken: set[int] | None = None) -> int:
    """A free port below the kernel's ephemeral range.  A port from that range (what
    binding port 0 gives) can be taken between now and the listener's bind by any
    outgoing connection, the workers' own to rank 0 included: a CI run once lost the
    bridge's port that way.  ``taken``: ports already chosen, not to be given again."""
    taken = set() if taken is None else taken
    low = _ephemeral_low()
    if low > 12000:
        for _ in range(200):
            port = random.randrange(10000, low)
            if port in taken:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            taken.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    taken.add(port)
    return port


@dataclass
class LocalBridge:
    url: str
    api_key: str
    log: Path
    rank0_log: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def serve_lines(self) -> list[str]:
        """Rank 0's ``[k3-dist][serve]`` lines (one per answered request)."""
        return [x for x in self.rank0_log.read_text().splitlines() if "[k3-dist][serve]" in x]


def start_local_bridge(
    directory: Path,
    *,
    api_key: str = "bridge-key",
    env: Mapping[str, str] | None = None,
    python: Path | None = None,
    max_ctx: int = 8192,
) -> LocalBridge:
    """Rank 0, two workers and the bridge, ready to answer (``env``: K3_* and FAKE_*)."""
    directory.mkdir(parents=True, exist_ok=True)
    model_dir = directory / "model"
    model = write_recipe_twin(model_dir)[0]
    tokenizer, template = write_model_extras(model_dir)
    recipe = install_recipe(directory, python=python)
    chosen: set[int] = set()
    coord, serve, http = free_port(chosen), free_port(chosen), free_port(chosen)
    common = ["--world", "3", "--model", str(model), "--max-ctx", str(max_ctx)]
    binary = [sys.executable, str(FAKES / "kimi_k3_dist_generate")]
    base = {**os.environ, "FAKE_SPARKINFER_SHARD_DELAY_S": "0", **(env or {})}
    rank0_log = directory / "rank0.log"
    log = directory / "bridge.log"
    procs: list[subprocess.Popen[bytes]] = []
    bridge = LocalBridge(f"http://127.0.0.1:{http}", api_key, log, rank0_log, procs)
    try:
        with rank0_log.open("wb") as fh:
            procs.append(subprocess.Popen(
                [*binary, "--rank", "0", "--listen", f"127.0.0.1:{coord}",
                 "--serve", f"127.0.0.1:{serve}", *common],
                stdout=fh, stderr=subprocess.STDOUT, env=base,
            ))  # fmt: skip
        for r in (1, 2):
            procs.append(subprocess.Popen(
                [*binary, "--rank", str(r), "--coord", f"127.0.0.1:{coord}", *common],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=base,
            ))  # fmt: skip
        _wait(lambda: "serve mode listening" in rank0_log.read_text(), 30, "rank 0 serving")
        bridge_env = {
            **base,
            "K3_TOKENIZER_DIR": str(tokenizer),
            "K3_CHAT_TEMPLATE": str(template),
            "K3_API_HOST": "127.0.0.1",
            "K3_API_PORT": str(http),
            "K3_SERVE_HOST": "127.0.0.1",
            "K3_SERVE_PORT": str(serve),
            "K3_API_KEY": api_key,
        }
        with log.open("wb") as fh:
            procs.append(subprocess.Popen(
                ["bash", str(recipe / "api-server" / "run-api.sh")],
                stdout=fh, stderr=subprocess.STDOUT, env=bridge_env,
            ))  # fmt: skip

        def ready() -> bool:
            if procs[-1].poll() is not None:
                raise AssertionError(f"the bridge exited:\n{log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{bridge.url}/readyz", timeout=1).status_code == 200
            return False

        _wait(ready, 30, "the bridge ready")
    except BaseException:
        bridge.stop()
        raise
    return bridge


@contextlib.contextmanager
def local_bridge(directory: Path, **kwargs: object) -> Iterator[LocalBridge]:
    bridge = start_local_bridge(directory, **kwargs)  # type: ignore[arg-type]
    try:
        yield bridge
    finally:
        bridge.stop()


def _wait(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
