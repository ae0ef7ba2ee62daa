"""Progress reporting and cancellation, shared by every long operation in core."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from k3desk.core.errors import Cancelled


class CancelToken:
    """A thread-safe flag a caller sets to ask a running operation to stop.

    Operations call :meth:`raise_if_cancelled` at safe points; callers may
    register callbacks (e.g. to terminate a child process) with :meth:`on_cancel`.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks = list(self._callbacks)
        for cb in callbacks:
            cb()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when cancelled (at once if already cancelled)."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise Cancelled()

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; return True if cancelled meanwhile."""
        return self._event.wait(timeout)


@dataclass(frozen=True)
class Progress:
    """One progress report: ``done`` of ``total`` units (total 0 = unknown)."""

    stage: str
    done: int = 0
    total: int = 0
    detail: str = ""

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total > 0 else None


ProgressCallback = Callable[[Progress], None]


def no_progress(_: Progress) -> None:
    """A progress callback that ignores every report."""
