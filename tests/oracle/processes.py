"""k3desk as a person runs it: real processes, from the repository's root."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


@contextmanager
def serving(*args: str | Path) -> Iterator[dict[str, str]]:
    """``k3desk serve ...`` as a process, until it prints the engine's pid."""
    with subprocess.Popen(
        [sys.executable, "-m", "k3desk", "serve", *map(str, args)],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        facts: dict[str, str] = {}
        seen: list[str] = []
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 120
            while "Engine pid" not in facts:
                line = proc.stdout.readline()
                if not line or time.monotonic() > deadline:
                    pytest.fail("k3desk serve did not get ready:\n" + "".join(seen))
                seen.append(line)
                key, sep, value = line.partition(": ")
                if sep:
                    facts[key.strip()] = value.strip()
            facts["output"] = "".join(seen)
            yield facts
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def k3desk(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``k3desk ARGS`` to the end: its exit status and output."""
    return subprocess.run(
        [sys.executable, "-m", "k3desk", *map(str, args)],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
