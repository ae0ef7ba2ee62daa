"""The restart loop every supervised launch shares: one engine, or a group across nodes.

A launch is a sequence of attempts on one monitor thread.  Each attempt starts
what it supervises, waits until it is ready, watches it, and ends in one of two
ways: stopped on request (the loop ends), or failed (the loop decides).  A
failure either counts against the budget of consecutive failures or, when it
changed something that gets the next attempt further (a re-plan), does not.  A
launch that stayed ready for ``stable_after`` seconds has its count reset, so one
crash a day does not use up the budget while a crash loop still ends.  Between
attempts the loop backs off exponentially (:meth:`BackoffPolicy.backoff`).

:class:`SupervisedLaunch` holds that loop and the waiting shells do on it
(:meth:`~SupervisedLaunch.wait_ready`, :meth:`~SupervisedLaunch.wait_stopped`,
:meth:`~SupervisedLaunch.stop`); :class:`k3desk.core.engines.supervisor.Supervisor`
(one llama-server) and :class:`k3desk.core.cluster.group.GroupSupervisor` (ranks
and workers that only work together) say what an attempt is, which failures
restarting can fix, and which states they report.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Generic, TypeVar

from k3desk.core.errors import Cancelled, EngineError
from k3desk.core.progress import CancelToken

log = logging.getLogger(__name__)

EndpointT = TypeVar("EndpointT")


@dataclass(frozen=True)
class BackoffPolicy:
    """How often a failing launch is tried again, and how long between tries."""

    max_failures: int = 3  # consecutive failed attempts before giving up
    backoff_initial: float = 1.0  # seconds before the first restart
    backoff_factor: float = 2.0
    backoff_max: float = 30.0
    # a launch that has been ready this long has its failure count reset
    stable_after: float = 300.0
    stop_grace: float = 10.0  # seconds between SIGTERM and SIGKILL

    def backoff(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th consecutive failure (1, 2, 4 ... max)."""
        delay = self.backoff_initial * self.backoff_factor ** max(0, failures - 1)
        return float(min(self.backoff_max, delay))

    def failures_after(self, failures: int, end: AttemptEnd) -> int:
        """The consecutive-failure count once ``end`` is taken into account."""
        if end.ready_at is not None and end.ended_at - end.ready_at >= self.stable_after:
            failures = 0
        return failures + 1 if end.counts else failures


@dataclass(frozen=True)
class AttemptEnd:
    """How a failed attempt ended: when it was ready (if ever), when it ended, why."""

    ready_at: float | None
    ended_at: float
    cause: object  # what the subclass needs to decide (a crash report, a failure)
    counts: bool = True  # False: a re-plan, which has a budget of its own


@dataclass(frozen=True)
class Retry:
    delay: float


@dataclass(frozen=True)
class GiveUp:
    message: str
    hint: str = ""


class SupervisedLaunch(Generic[EndpointT]):
    """Base class: the monitor thread, the restart loop and the waits on it."""

    kind = "launch"  # named in messages: "The {kind} was not ready within ..."

    def __init__(self, policy: BackoffPolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._endpoint: EndpointT | None = None

    # ------------------------------------------------------------ public
    @property
    def endpoint(self) -> EndpointT | None:
        with self._lock:
            return self._endpoint

    def start(self) -> None:
        """Launch in the background; follow with :meth:`wait_ready`."""
        if self._thread is not None:
            raise EngineError(f"This {self.kind} was already started; create a new one.")
        self._thread = threading.Thread(target=self._run, name=f"{self.kind}-monitor", daemon=True)
        self._thread.start()

    def wait_ready(
        self, timeout: float | None = None, cancel: CancelToken | None = None
    ) -> EndpointT:
        """Block until ready (through restarts).

        Raises :class:`EngineError` with the cause when the launch gives up or
        ``timeout`` passes, and :class:`Cancelled` (after stopping) when ``cancel`` fires.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ep = self.endpoint
            if ep is not None:
                return ep
            if self._done.is_set():
                raise self._final_error()
            if cancel is not None and cancel.cancelled:
                self.stop()
                raise Cancelled()
            if deadline is not None and time.monotonic() > deadline:
                raise self._not_ready_error(timeout or 0.0)
            self._ready.wait(0.05)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def stop(self) -> None:
        """Stop what runs and end the loop; idempotent."""
        self._stop.set()
        self._wake()
        thread = self._thread
        if thread is None:
            self._done.set()
        elif thread is not threading.current_thread():
            thread.join(self._join_timeout())

    close = stop

    def __enter__(self) -> SupervisedLaunch[EndpointT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ for subclasses
    def _attempt(self, number: int) -> AttemptEnd | None:
        """Run attempt ``number`` until it fails (its end) or is stopped (None)."""
        raise NotImplementedError

    def _next(self, end: AttemptEnd, failures: int) -> Retry | GiveUp:
        """After a failure (``failures`` in a row, counted by the policy): again, or not."""
        raise NotImplementedError

    def _gave_up(self, number: int, verdict: GiveUp) -> None:
        """Report the end of a launch that gave up (the final state)."""
        raise NotImplementedError

    def _broke(self, number: int, exc: Exception) -> None:
        """Report a bug in the loop itself (the final state)."""
        raise NotImplementedError

    def _stopped(self, number: int) -> None:
        """Report the end of a launch stopped on request."""
        raise NotImplementedError

    def _final_error(self) -> EngineError:
        raise NotImplementedError

    def _not_ready_error(self, timeout: float) -> EngineError:
        return EngineError(f"The {self.kind} was not ready within {timeout:.0f} s.")

    def _wake(self) -> None:
        """Wake a monitor waiting for something other than the stop event."""

    def _join_timeout(self) -> float:
        return self.policy.stop_grace + 10.0

    def _lose_endpoint(self) -> None:
        """What was ready is gone: nobody may be handed its endpoint any more."""
        self._ready.clear()
        with self._lock:
            self._endpoint = None

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        failures = 0
        number = 0
        ended = False  # gave up, or broke: the final state is reported already
        try:
            while not self._stop.is_set():
                number += 1
                end = self._attempt(number)
                self._lose_endpoint()
                if end is None or self._stop.is_set():
                    break
                failures = self.policy.failures_after(failures, end)
                verdict = self._next(end, failures)
                if isinstance(verdict, GiveUp):
                    ended = True
                    self._gave_up(number, verdict)
                    break
                if self._stop.wait(verdict.delay):
                    break
        except Exception as exc:  # report instead of dying silently
            log.exception("%s monitor failed", self.kind)
            self._lose_endpoint()
            ended = True
            self._broke(number, exc)
        finally:
            self._lose_endpoint()
            try:
                if not ended:
                    self._stopped(number)
            finally:
                self._done.set()
