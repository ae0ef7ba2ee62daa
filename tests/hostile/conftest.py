"""What every hostile case checks, in one place.

Each case asserts a clear message, the exit status, that nothing was written
outside the place it belongs, that nothing committed was lost, and that it ended
in bounded time and memory:

* :func:`files_under` / :func:`written_outside`: a snapshot of a folder tree, and
  what appeared in it outside the allowed folders;
* :func:`bounded`: runs a call on a thread, fails the test if it is still running
  after ``seconds`` (after asking it to stop), and measures the peak growth of this
  process's resident memory meanwhile;
* :func:`run_k3desk`: the CLI as a user runs it, in a child process, with a limit
  on its address space and time;
* :data:`NOT_A_FILE`: what can stand where k3desk expects one of its own files (a
  named pipe, a link to ``/dev/zero``, 170 MB that cost no disk).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from tests.conftest import REPO
from tests.hostile.hostile_hub import HostileHub

T = TypeVar("T")


@pytest.fixture
def hostile_hub() -> Iterator[HostileHub]:
    with HostileHub(page_size=50) as hub:
        yield hub


def files_under(root: Path) -> set[Path]:
    """Every file and link under ``root`` (folders are not counted)."""
    out: set[Path] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(Path(dirpath) / d)]:
            out.add(Path(dirpath) / name)
    return out


def written_outside(root: Path, before: set[Path], *allowed: Path) -> list[str]:
    """Files under ``root`` that were not there ``before`` and are in none of ``allowed``."""
    fresh = files_under(root) - before
    return sorted(str(p) for p in fresh if not any(p.is_relative_to(a) for a in allowed))


@dataclass
class Bounded:
    value: Any = None
    error: BaseException | None = None
    seconds: float = 0.0
    peak_rss_growth: int = 0  # bytes


def bounded(
    fn: Callable[[], T], seconds: float, *, stop: Callable[[], None] | None = None
) -> Bounded:
    """Run ``fn`` on a thread; fail the test when it is still running after ``seconds``."""
    me = psutil.Process()
    base = me.memory_info().rss
    out = Bounded()
    done = threading.Event()

    def work() -> None:
        try:
            out.value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.error = exc
        finally:
            done.set()

    t0 = time.monotonic()
    threading.Thread(target=work, name="hostile-case", daemon=True).start()
    while not done.wait(0.01):
        out.peak_rss_growth = max(out.peak_rss_growth, me.memory_info().rss - base)
        if time.monotonic() - t0 > seconds:
            if stop is not None:
                stop()
            done.wait(10)
            pytest.fail(f"still running after {seconds:.0f} s: not bounded in time")
    out.peak_rss_growth = max(out.peak_rss_growth, me.memory_info().rss - base)
    out.seconds = time.monotonic() - t0
    return out


def fifo(path: Path) -> None:
    os.mkfifo(path)


def dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def huge(path: Path, size: int = 170 * 1000 * 1000) -> None:
    """``size`` bytes of zeros as a sparse file: no disk, no time."""
    with open(path, "wb") as f:
        f.truncate(size)


NOT_A_FILE: dict[str, Callable[[Path], None]] = {
    "fifo": fifo,
    "link to /dev/zero": dev_zero,
    "170 MB": huge,
}


def k3desk_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("HF_TOKEN", None)
    env.update({"HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


# The CLI's address space: a Python with numpy, httpx and huggingface_hub loaded
# maps about 1 GiB; 2.5 GiB leaves room for work and none for reading a bomb whole.
CLI_ADDRESS_SPACE = int(2.5 * 1024**3)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CLI_ADDRESS_SPACE, CLI_ADDRESS_SPACE))


def run_k3desk(
    *args: str | bytes | Path,
    env: dict[str, str] | None = None,
    input: bytes | None = None,
    timeout: float = 120,
    stdout: Any = subprocess.PIPE,
) -> subprocess.CompletedProcess[bytes]:
    """``python -m k3desk ARGS`` with bytes in and out (undecodable ones included)."""
    return subprocess.run(
        [sys.executable, "-m", "k3desk", *(os.fsencode(a) for a in args)],
        env=env or k3desk_env(),
        cwd=REPO,
        input=input,
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=timeout,
        preexec_fn=_limit_memory,
        check=False,
    )


def png(seed: int = 1) -> bytes:
    """A small valid PNG (16 x 16, one colour)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (seed % 256, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


def no_traceback(stderr: bytes) -> None:
    text = stderr.decode("utf-8", "replace")
    assert "Traceback" not in text, text
    assert "Exception ignored" not in text, text


# the chat tests' OpenAI-compatible stand-in (streams like llama-server b11434)
from tests.core.chat.conftest import StandIn, standin  # noqa: E402, F401
