"""The real size, end to end: Kimi-K3 at 300+ GiB on a machine smaller than it.

A sparse twin (``k3desk.devtools.twin``: the tier's real file names, headers and tensor
layout, data as holes) goes through ``validate`` -> ``plan`` -> ``serve`` -> ``chat``
with the real llama-server until a generated token comes back, then ``serve`` is
stopped and nothing of it may be left running.

What it costs on 2 cores and 24 GiB: llama.cpp maps every shard with MAP_POPULATE
(about 2.5-3 min for 528 GiB of holes, which the kernel fills with zeros: no disk
reads), the prompt's few dozen tokens page in most of the experts once, and one token
about half a minute.  Holes show the memory and paging costs, not a disk's reads.
The rehearsal runs vcruz305's 9-part UD-IQ1_S (307.5 GiB): the load reads every byte
once, so its time follows the size, and GrEarl's 94-part IQ1_S (528 GiB) took 11.6 min
to load on this 2-core machine while others worked on it, past the suite's 10 minutes.
``bench/real_scale.py`` runs the 94-part one.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from k3desk.core.units import GiB

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
# serve must be ready within this: the plan predicts ~1.5 min for 308 GiB at 3.5 GB/s; a
# shared 2-core machine under load pages holes in at ~1 GB/s (measured: 11.6 min for the
# 94-part 528 GiB set at load average 10-15)
LOAD_LIMIT_S = 900
TIER = "vcruz305-ud-iq1s"  # 9 parts, 307.5 GiB


def _k3(*argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "k3desk", *map(str, argv)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _engines_on(shard: Path) -> list[psutil.Process]:
    """llama-server processes running this model."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if str(shard) in cmd:
            found.append(p)
    return found


def test_a_300_gib_k3_validates_plans_serves_and_answers_on_a_smaller_machine(
    llama_server: Path, twin_factory: Callable[[str], list[Path]], tmp_path: Path
) -> None:
    # sparse files: a few MB of headers on disk, 528 GiB apparent
    free = shutil.disk_usage(tmp_path).free
    assert free > 1 * GiB, f"{free} bytes free at {tmp_path}: not even the headers fit"
    parts = twin_factory(TIER)
    shard = parts[0]
    assert len(parts) == 9
    apparent = sum(p.stat().st_size for p in parts)
    on_disk = sum(p.stat().st_blocks * 512 for p in parts)
    assert apparent > 300 * GiB
    if on_disk > 1 * GiB:
        pytest.fail(f"{tmp_path} does not keep holes ({on_disk} bytes used): a sparse twin "
                    "needs a file system with sparse files (ext4, xfs, btrfs, tmpfs)")  # fmt: skip
    if psutil.virtual_memory().total >= apparent:
        pytest.skip("this machine holds the whole model: the rehearsal is for smaller ones")

    r = _k3("validate", shard)
    assert r.returncode == 0, r.stdout + r.stderr

    r = _k3("plan", shard)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Streams from disk" in r.stdout, r.stdout
    assert " -ngl " not in r.stdout
    # (this tier has no weight type ggml-cpu repacks: the plan needs no --no-repack; the
    # 94-part IQ1_S's 28 GiB of Q4_K/IQ4_NL do, see tests/core/planning)
    assert "--mlock" not in r.stdout

    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    argv = ["serve", str(shard), "--engine", str(llama_server), "--ctx", "1024"]
    # without accepting, serve refuses and says what a token and the load cost
    r = _k3(*argv)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "s per token after a load of up to" in r.stderr, r.stderr
    assert "--accept-slow" in r.stderr

    out: list[str] = []
    t0 = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-m", "k3desk", *argv, "--accept-slow"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as serve:
        lines: queue.Queue[str] = queue.Queue()
        assert serve.stdout is not None
        stdout = serve.stdout

        def read() -> None:
            for x in stdout:
                lines.put(x)

        threading.Thread(target=read, daemon=True).start()
        try:
            while not any(line.startswith("Press Ctrl-C") for line in out):
                try:
                    line = lines.get(timeout=5)
                except queue.Empty:
                    line = ""
                if serve.poll() is not None and lines.empty():
                    pytest.fail("k3desk serve ended:\n" + "".join(out))
                if line:
                    out.append(line)
                if time.monotonic() - t0 > LOAD_LIMIT_S:
                    pytest.fail("not ready in time:\n" + "".join(out))
            ready_s = time.monotonic() - t0
            text = "".join(out)
            url = re.search(r"^URL: (\S+)", text, re.M)
            key = re.search(r"^API key: (\S+)", text, re.M)
            assert url is not None
            assert key is not None
            assert "Warning: " in text
            assert "paged in" in text, text  # load progress: bytes paged in and the rate
            args = next(x for x in out if x.startswith("Arguments: ")).split()
            assert "-ngl" not in args
            assert "--no-mmap" not in args

            chat = _k3(
                "chat", "--url", url.group(1), f"--api-key={key.group(1)}",
                "--max-tokens", "1", "--seed", "1", "Hi", timeout=900,
            )  # fmt: skip
            assert chat.returncode == 0, chat.stdout + chat.stderr
            stats = re.search(r"\[(\d+) prompt tokens, (\d+) generated", chat.stderr)
            assert stats is not None, chat.stderr
            assert int(stats.group(1)) > 0
            assert int(stats.group(2)) >= 1
            print(f"ready after {ready_s:.0f} s; chat: {chat.stderr.strip()}")
        finally:
            serve.send_signal(signal.SIGINT)
            try:
                serve.wait(60)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait(10)
    assert serve.returncode == 0
    deadline = time.monotonic() + 10
    while _engines_on(shard) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _engines_on(shard) == [], "llama-server is still running after serve stopped"
