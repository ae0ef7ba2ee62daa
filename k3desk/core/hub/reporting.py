"""Byte counting, speed and ETA, and serialised event delivery for one download job."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

from k3desk.core.hub.model import DownloadEvent, FileProgress, Phase

# seconds of history behind a speed figure: long enough that connections starting
# together, or a socket buffer drained at memory speed, do not read as the link's rate
WINDOW = 15.0
# a rate is said only once bytes have arrived over this long; before, it is unknown
MIN_SPAN = 2.0


class Rate:
    """Bytes per second over the last :data:`WINDOW` seconds.

    The clock starts at the first bytes, not when the object is made: time spent
    before them (connecting, hashing other files) is no part of a transfer rate.
    Until bytes have arrived over :data:`MIN_SPAN` seconds the rate is unknown (0):
    a figure from a few milliseconds of bytes is a burst, not a rate.  A pause in
    the middle (a retry, a stalled link) counts: no bytes came then.
    """

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()
        self._total = 0

    def add(self, n: int, now: float) -> None:
        self._total += n
        if not self._samples:
            # these first bytes took an unknown time to arrive: measure from after them
            self._samples.append((now, self._total))
        elif now - self._samples[-1][0] >= 0.1:  # a sample per 0.1 s is plenty
            self._samples.append((now, self._total))
            # keep one sample at or before the window's start: the bytes since it
            while len(self._samples) > 2 and self._samples[1][0] <= now - WINDOW:
                self._samples.popleft()

    def speed(self, now: float) -> float:
        if not self._samples:
            return 0.0
        start = now - WINDOW
        base_t, base_b = self._samples[0]
        for t, b in self._samples:
            if t > start:
                break
            base_t, base_b = t, b
        # the bytes after a sample older than the window arrived after the window began
        # (a sample is taken at the first bytes after a gap)
        span = now - max(base_t, start)
        if now - self._samples[0][0] < MIN_SPAN or span <= 0.001:
            return 0.0
        return (self._total - base_b) / span


def eta(remaining: int, speed: float) -> float | None:
    """Seconds left at ``speed``: 0 when nothing remains, None while the speed is unknown."""
    return remaining / speed if speed > 0 and remaining > 0 else (0.0 if remaining <= 0 else None)


class Events:
    """Delivers events to the caller's callback one at a time, from any thread."""

    def __init__(self, on_event: Callable[[DownloadEvent], None] | None) -> None:
        self._cb = on_event
        self._lock = threading.Lock()

    def emit(self, event: DownloadEvent) -> None:
        if self._cb is None:
            return
        with self._lock:
            self._cb(event)


class Overall:
    """The bytes of the whole set.

    ``total`` is the set's size, fixed from the start: a resumed download shows the
    same total as the first run.  ``done`` counts the bytes already on disk when the
    job began (files kept, partial files it resumes) and every byte that arrived
    since; where bytes must come again (an attempt that starts over, a file whose hash
    did not match) they leave ``done``, so ``total - done`` is always what is left.
    ``fetched`` is the network bytes alone, which the speed is measured from.
    """

    def __init__(self, total: int, done: int = 0) -> None:
        self.total = total
        self.done = done
        self.fetched = 0
        self.last_byte = 0.0  # time.monotonic() of the last network byte (0: none yet)
        self._rate = Rate()
        self._lock = threading.Lock()

    def add(self, n: int, now: float) -> int:
        with self._lock:
            self.done += n
            self.fetched += n
            self.last_byte = now
            self._rate.add(n, now)
            return self.done

    def undo(self, n: int) -> None:
        """``n`` bytes counted done must come again (negative: more are on disk)."""
        with self._lock:
            self.done -= n

    def speed(self, now: float) -> float:
        with self._lock:
            return self._rate.speed(now)


class FileTask:
    """One file's transfer: counts its bytes, reports progress, can be aborted.

    :meth:`abort` is how a stall or a cancel interrupts a transfer that is
    blocked in a socket read: it shuts the connection's socket down (which wakes
    the reading thread at once) or terminates the child process doing the work.
    """

    def __init__(
        self,
        path: str,
        size: int,
        events: Events,
        overall: Overall,
        interval: float,
        phase: Phase = "download",
        counted: int = 0,
    ) -> None:
        """``counted``: bytes of this file ``overall.done`` holds already (what the job
        found on disk for it, or all of it where it came once and must come again)."""
        self.path = path
        self.size = size
        self.events = events
        self.overall = overall
        self.interval = interval
        self.phase = phase
        self.done = 0
        self.fetched = 0  # network bytes this run
        self.last_byte = time.monotonic()
        self.active = False  # a transfer is in flight (stall watch applies)
        self.abort_reason = ""
        self.stalled_for = 0.0
        self._rate = Rate()
        self._counted = counted
        self._started = False
        self._last_emit = 0.0
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._closer: Callable[[], None] | None = None

    # ----------------------------------------------------------- connection
    def attach(
        self, sock: socket.socket | None = None, closer: Callable[[], None] | None = None
    ) -> None:
        with self._lock:
            self._sock, self._closer = sock, closer
            self.abort_reason = ""
            self.active = True
            self.last_byte = time.monotonic()

    def detach(self) -> None:
        with self._lock:
            self._sock = self._closer = None
            self.active = False

    def abort(self, reason: str) -> None:
        with self._lock:
            self.abort_reason = reason
            sock, closer = self._sock, self._closer
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if closer is not None:
            closer()

    # ----------------------------------------------------------- progress
    def start_at(self, offset: int) -> None:
        """A transfer attempt begins at byte ``offset`` (what is before it is on disk)."""
        if not self._started:
            self._started = True
            self.done = self._counted
        self._starts_over(offset)
        self.done = offset

    def _starts_over(self, offset: int) -> None:
        # the bytes from offset to where this file stood have to come again (or, rarely,
        # more of it is on disk than the job counted)
        if self.done != offset:
            self.overall.undo(self.done - offset)

    def add(self, n: int, *, network: bool = True) -> None:
        """``n`` more bytes (from any thread: a file fetched in ranges has several)."""
        now = time.monotonic()
        with self._lock:
            self.done += n
            done = self.done
            self.last_byte = now
            self._rate.add(n, now)
            if network:
                self.fetched += n
            emit = now - self._last_emit >= self.interval or done >= self.size
            if emit:
                self._last_emit = now
                speed = self._rate.speed(now)
        overall_done = self.overall.add(n, now) if network else self.overall.done
        if emit:
            # hashing bytes are not network bytes, but the network keeps going meanwhile
            overall_speed = self.overall.speed(now)
            self.events.emit(
                FileProgress(
                    path=self.path,
                    done=done,
                    size=self.size,
                    speed=speed,
                    eta=eta(self.size - done, speed),
                    overall_done=overall_done,
                    overall_total=self.overall.total,
                    overall_speed=overall_speed,
                    overall_eta=eta(self.overall.total - overall_done, overall_speed),
                    phase=self.phase,
                )
            )

    def rewind(self, to: int) -> None:
        """The transfer restarted from ``to`` (the server ignored a Range request)."""
        self._starts_over(to)
        self.done = to
