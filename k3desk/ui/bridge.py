"""The one adapter layer from core callbacks (any thread) to Qt signals (main thread).

Core operations report through plain callables: ``ProgressCallback``, download
events, engine state changes, chat deltas.  The objects here are those
callables; each turns a call into a signal emission that Qt queues onto the
main thread, so widgets connected to the signals are never touched from a
worker.  Two of them also rate-limit: :class:`Throttled` keeps only the newest
value (progress bars), :class:`StreamBuffer` concatenates text (token streams);
both deliver at most ``hz`` times a second.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot


class Relay(QObject):
    """A callable that re-emits every call as :attr:`fired` on the main thread.

    Signals:
        fired(object): the value the core passed to the callback.
    """

    fired = Signal(object)

    def __call__(self, value: Any) -> None:
        self.fired.emit(value)


class Throttled(QObject):
    """A callable that keeps only the newest value and emits it at most ``hz`` times a second.

    The final value is never lost: call :meth:`flush` (main thread) when the
    operation ends, or let the timer deliver it.

    Signals:
        fired(object): the newest value since the last emission.
    """

    fired = Signal(object)
    _poke = Signal()

    def __init__(self, hz: float = 10.0, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._pending: Any = None
        self._has_pending = False
        self._timer = QTimer(self)
        self._timer.setObjectName("throttle")
        self._timer.setSingleShot(True)
        self._timer.setInterval(max(1, int(1000 / hz)))
        self._timer.timeout.connect(self.flush)
        self._poke.connect(self._arm, Qt.ConnectionType.QueuedConnection)

    def __call__(self, value: Any) -> None:
        with self._lock:
            first = not self._has_pending
            self._pending = value
            self._has_pending = True
        if first:
            self._poke.emit()

    @Slot()
    def _arm(self) -> None:
        if not self._timer.isActive():
            self._timer.start()

    @Slot()
    def flush(self) -> None:
        with self._lock:
            if not self._has_pending:
                return
            value, self._pending, self._has_pending = self._pending, None, False
        self.fired.emit(value)


class StreamBuffer(QObject):
    """Collects streamed text pieces from a worker and hands them over in batches.

    ``append(kind, text)`` may be called hundreds of times a second from the
    worker; :attr:`batch` fires at most ``hz`` times a second on the main thread
    with everything that arrived since the previous batch, as a dict
    ``{kind: text}`` (kinds e.g. ``"content"``, ``"reasoning"``) plus the number
    of pieces under the key ``"#pieces"``.

    Signals:
        batch(object): dict of kind -> concatenated text, and ``"#pieces"``.
    """

    batch = Signal(object)
    _poke = Signal()

    def __init__(self, hz: float = 30.0, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._parts: dict[str, list[str]] = {}
        self._pieces = 0
        self._last = 0.0
        self._interval = 1.0 / hz
        self._timer = QTimer(self)
        self._timer.setObjectName("stream-flush")
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.flush)
        self._poke.connect(self._arm, Qt.ConnectionType.QueuedConnection)

    def append(self, kind: str, text: str) -> None:
        if not text:
            return
        with self._lock:
            first = self._pieces == 0
            self._parts.setdefault(kind, []).append(text)
            self._pieces += 1
        if first:
            self._poke.emit()

    @Slot()
    def _arm(self) -> None:
        if self._timer.isActive():
            return
        wait = self._interval - (time.monotonic() - self._last)
        self._timer.start(max(0, int(wait * 1000)))

    @Slot()
    def flush(self) -> None:
        with self._lock:
            if not self._pieces:
                return
            parts, self._parts = self._parts, {}
            pieces, self._pieces = self._pieces, 0
        self._last = time.monotonic()
        out: dict[str, Any] = {k: "".join(v) for k, v in parts.items()}
        out["#pieces"] = pieces
        self.batch.emit(out)
