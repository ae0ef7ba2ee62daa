"""Helpers for tests that watch real processes end."""

from __future__ import annotations

import os
import queue
import re
import signal
import threading
import time
from typing import IO, Any

import psutil

from k3desk.core.chat.client import ChatClient


def gone_within(pid: int, seconds: float) -> bool:
    """True once ``pid`` no longer runs (a zombie nobody reaped yet counts as gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


class LineReader:
    """A child's output, read on a thread of its own, so that a test waiting for a line
    is bounded by its own deadline even when the child goes silent without exiting
    (a blocking ``readline`` would wait for the suite's timeout, and what the child
    said before would be lost)."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._stream = stream
        threading.Thread(target=self._pump, name="line-reader", daemon=True).start()

    def _pump(self) -> None:
        try:
            for line in self._stream:
                self._queue.put(line)
        except (OSError, ValueError):  # closed under us
            pass
        self._queue.put(None)

    def _take(self, deadline: float) -> str | None:
        """The next line, or None once ``deadline`` passes or the output has ended."""
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            line = self._queue.get(timeout=left)
        except queue.Empty:
            return None
        if line is None:
            self._queue.put(None)  # ended: so for every later call too
            return None
        self.lines.append(line)
        return line

    def until(self, pattern: str, seconds: float) -> re.Match[str] | None:
        """The first line from here on that ``pattern`` matches (``re.match``); None
        once ``seconds`` pass or the output ends first."""
        deadline = time.monotonic() + seconds
        while (line := self._take(deadline)) is not None:
            m = re.match(pattern, line)
            if m:
                return m
        return None

    def text(self, settle: float = 0.0) -> str:
        """Everything read so far, after waiting up to ``settle`` seconds for the end."""
        deadline = time.monotonic() + settle
        while self._take(deadline) is not None:
            pass
        return "".join(self.lines)


class SlotsHeld(ChatClient):
    """A client of a real engine that is held still (SIGSTOP) for ``pause`` seconds as
    each of its slot requests (save, restore) is sent, as a slow or busy disk holds them;
    the requests go to the engine unchanged.  ``held_at``: when it was last held."""

    pause = 1.0
    held_at = 0.0

    def call(self, method: str, path: str, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        pid = self.endpoint.owner_pid
        if path.startswith("/slots/") and pid is not None:
            os.kill(pid, signal.SIGSTOP)
            self.held_at = time.monotonic()
            threading.Timer(self.pause, os.kill, (pid, signal.SIGCONT)).start()
        return super().call(method, path, *args, **kwargs)
