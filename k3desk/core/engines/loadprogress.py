"""How far a loading llama-server has got: its log's phases, progress dots and bytes read."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from k3desk.core.engines.crash import strip_log_prefix
from k3desk.core.units import fmt_bytes

_PHASES: tuple[tuple[re.Pattern[str], int, str], ...] = tuple(
    (re.compile(p), pct, text)
    for p, pct, text in (
        (r"load_model: loading model", 3, "opening the model"),
        (r"llama_model_loader: loaded meta data", 8, "reading the model header"),
        (r"load_tensors: loading model tensors", 12, "loading tensors"),
        (r"llama_context: constructing", 80, "creating the context"),
        (r"sched_reserve: reserving", 85, "reserving compute buffers"),
        (r"warming up the model", 90, "warming up"),
        (r"loaded multimodal model", 93, "vision projector loaded"),
        (r"llama_server: model loaded|main: model loaded", 97, "model loaded"),
        (r"listening on|server is listening", 99, "listening"),
    )
)
_TENSOR_SPAN = (12, 78)  # progress dots (one per percent of tensors loaded) map here
BYTES_PROGRESS_MIN = 1 << 30  # below 1 GiB loads are too quick to be worth watching


class LoadProgressParser:
    """Turns llama-server's log into a 0-100 load estimate (phases plus progress dots)."""

    def __init__(self) -> None:
        self.percent = 0
        self.phase = "starting"
        self._dots = 0
        self._first: tuple[float, int] | None = None  # (when, bytes) of the first sample

    def feed_line(self, line: str) -> bool:
        """Read one line; True if the estimate changed."""
        text = strip_log_prefix(line)
        for pattern, pct, phase in _PHASES:
            if pattern.search(text) and pct > self.percent:
                self.percent, self.phase = pct, phase
                return True
        stripped = text.strip()
        if stripped and set(stripped) == {"."}:
            return self.feed_dots(len(stripped))
        return False

    def feed_bytes(self, done: int, total: int) -> bool:
        """Bytes the server has read or mapped in so far, of a model of ``total`` bytes
        (the log says little during a long load at the default verbosity)."""
        if total <= 0 or done <= 0:
            return False
        now = time.monotonic()
        if self._first is None:
            self._first = (now, done)
        lo, hi = _TENSOR_SPAN
        pct = lo + int((hi - lo) * min(1.0, done / total))
        if pct > self.percent:
            self.percent = pct
            rate = ""
            t0, b0 = self._first
            if now - t0 >= 1.0 and done > b0:
                rate = f", {fmt_bytes((done - b0) / (now - t0))}/s"
            self.phase = f"loading tensors ({fmt_bytes(done)} of {fmt_bytes(total)} paged in{rate})"
            return True
        return False

    def feed_dots(self, n: int) -> bool:
        self._dots = min(100, self._dots + n)
        lo, hi = _TENSOR_SPAN
        pct = lo + (hi - lo) * self._dots // 100
        if pct > self.percent:
            self.percent, self.phase = pct, "loading tensors"
            return True
        return False


def bytes_loaded(pid: int, parts: Sequence[Path] = ()) -> int:
    """How much of the model a loading server has touched: bytes it read from storage, its
    resident set, or the shards it has mapped in full, whichever is larger.

    Pages already in the page cache are not read, and a model larger than RAM never has
    more than RAM resident; but llama.cpp maps the shards one after the other, each with
    ``MAP_POPULATE`` (``src/llama-mmap.cpp``), which returns once the whole shard is paged
    in: every shard mapped before the last one seen in ``/proc/PID/maps`` is done."""
    mapped = _shards_mapped(pid, parts)
    try:
        p = psutil.Process(pid)
        rss = int(p.memory_info().rss)
        try:
            read = int(p.io_counters().read_bytes)
        except (psutil.AccessDenied, AttributeError):
            read = 0
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0
    return max(rss, read, mapped)


def _shards_mapped(pid: int, parts: Sequence[Path]) -> int:
    """Bytes of the shards ``pid`` has mapped in full (see :func:`bytes_loaded`)."""
    if len(parts) < 2:
        return 0
    try:
        maps = Path(f"/proc/{pid}/maps").read_text(errors="replace")
    except OSError:
        return 0
    index = {str(p): i for i, p in enumerate(parts)}
    seen = set()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        if len(fields) == 6 and fields[5].strip() in index:
            seen.add(index[fields[5].strip()])
    if not seen:
        return 0
    last = max(seen)
    total = 0
    for i in seen:
        if i != last:
            with contextlib.suppress(OSError):
                total += parts[i].stat().st_size
    return total
