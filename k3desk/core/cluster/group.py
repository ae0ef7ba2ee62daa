"""Supervising a group of processes that only work together (engine ranks, RPC workers).

A :class:`GroupSupervisor` launches every member, waits until the group is ready
(reporting phases through callbacks), then watches all members at once.  When
any member dies unexpectedly the whole group is torn down and launched again
(one restart counts one failure; a group that stayed up for ``stable_after``
seconds gets its count back), up to ``max_failures`` in a row; after that, or
after a failure restarting cannot fix (a refused model, a wrong flag, a missing
binary), it ends in ``failed`` with the reason.  ``stop`` brings every member down.

Subclasses implement :meth:`_launch` (start members, block until ready, raise
:class:`LaunchFailure` on failure) and :meth:`_teardown`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from k3desk.core.chat.client import ChatEndpoint
from k3desk.core.cluster.ssh import RemoteProcess
from k3desk.core.errors import EngineError
from k3desk.core.progress import CancelToken, Progress
from k3desk.core.supervision import (
    AttemptEnd,
    BackoffPolicy,
    GiveUp,
    Retry,
    SupervisedLaunch,
)

log = logging.getLogger(__name__)


class GroupState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True)
class GroupPolicy(BackoffPolicy):
    """The shared back-off policy; a group's members get a shorter grace to stop."""

    stop_grace: float = 8.0


@dataclass(frozen=True)
class GroupEvent:
    state: GroupState
    attempt: int
    message: str = ""
    progress: Progress | None = None
    final: bool = False


EventCallback = Callable[[GroupEvent], None]


class LaunchFailure(Exception):
    """A launch did not reach ready.  ``fatal``: restarting cannot fix it."""

    def __init__(self, message: str, hint: str = "", *, fatal: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.fatal = fatal


@dataclass
class GroupAttempt:
    number: int
    started_at: float
    ready_at: float | None = None
    ended_at: float | None = None
    outcome: str = ""  # "ready", the failure, or why it was restarted


class GroupSupervisor(SupervisedLaunch[ChatEndpoint]):
    """Base class: the shared restart loop (k3desk.core.supervision), where one attempt
    launches the whole group and then watches it until a member fails."""

    kind = "engine group"

    def __init__(
        self, *, policy: GroupPolicy | None = None, on_event: EventCallback | None = None
    ) -> None:
        super().__init__(policy or GroupPolicy())
        self._on_event = on_event
        self._state = GroupState.STOPPED
        self._fault = threading.Event()
        self._fault_reason = ""
        self._attempts: list[GroupAttempt] = []
        self._error: EngineError | None = None
        self._current = 0
        self._tearing_down = False
        self._cancel = CancelToken()

    # ------------------------------------------------------------ public
    @property
    def state(self) -> GroupState:
        with self._lock:
            return self._state

    @property
    def attempts(self) -> list[GroupAttempt]:
        with self._lock:
            return [replace(a) for a in self._attempts]

    @property
    def error(self) -> EngineError | None:
        with self._lock:
            return self._error

    @property
    def endpoint(self) -> ChatEndpoint | None:
        with self._lock:
            return self._endpoint if self._state is GroupState.READY else None

    def wait_state(self, state: GroupState, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state is state:
                return True
            time.sleep(0.02)
        return self.state is state

    def __enter__(self) -> GroupSupervisor:
        return self

    # ------------------------------------------------------------ for subclasses
    def _launch(self, attempt: int, cancel: CancelToken) -> ChatEndpoint:
        raise NotImplementedError

    def _teardown(self) -> None:
        raise NotImplementedError

    def fault(self, reason: str) -> None:
        """A member died or failed: restart the group (ignored while stopping)."""
        with self._lock:
            if self._tearing_down or self._stop.is_set():
                return
            if not self._fault.is_set():
                self._fault_reason = reason
            self._endpoint = None  # broken from now on, before the monitor even wakes
        self._ready.clear()
        self._fault.set()

    def _phase(self, message: str, done: int, total: int, detail: str = "") -> None:
        """Report launch progress (a phase of ``total``)."""
        self._emit(
            GroupEvent(self.state, self._current, message, Progress(message, done, total, detail))
        )

    def _check_running(self, cancel: CancelToken) -> None:
        """Raise if the launch must end: stop requested, or a member died."""
        if self._stop.is_set() or cancel.cancelled:
            raise LaunchFailure("stopped on request")
        if self._fault.is_set():
            raise LaunchFailure(self._fault_reason or "a member of the group ended")

    def _sleep(self, seconds: float, cancel: CancelToken) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._check_running(cancel)
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    # ------------------------------------------------------------ internals
    def _set_state(self, state: GroupState, message: str = "", *, final: bool = False) -> None:
        with self._lock:
            self._state = state
        self._emit(GroupEvent(state, self._current, message, None, final))

    def _emit(self, event: GroupEvent) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:  # a listener's bug must not kill the monitor
            log.exception("cluster event listener failed")

    def _do_teardown(self) -> None:
        with self._lock:
            self._tearing_down = True
            self._endpoint = None
        self._ready.clear()
        try:
            self._teardown()
        finally:
            with self._lock:
                self._tearing_down = False

    # ------------------------------------------------------------ the shared loop's steps
    def _wake(self) -> None:
        self._fault.set()  # the monitor waits on faults while the group is ready

    def _join_timeout(self) -> float:
        return self.policy.stop_grace * 3 + 15

    def _not_ready_error(self, timeout: float) -> EngineError:
        return EngineError(
            f"The {self.kind} was not ready within {timeout:.0f} s (state: {self.state.value}).",
            "See the logs of each node's process.",
        )

    def _final_error(self) -> EngineError:
        return self.error or EngineError(f"The {self.kind} stopped before it was ready.")

    def _attempt(self, number: int) -> AttemptEnd | None:
        self._current = number
        att = GroupAttempt(number, time.time())
        with self._lock:
            self._attempts.append(att)
            self._fault_reason = ""
        self._fault.clear()
        self._set_state(
            GroupState.STARTING if number == 1 else GroupState.RESTARTING, f"attempt {number}"
        )
        try:
            endpoint = self._launch(number, self._cancel)
        except LaunchFailure as exc:
            att.ended_at = time.time()
            att.outcome = exc.message
            self._do_teardown()
            return None if self._stop.is_set() else AttemptEnd(None, att.ended_at, exc)
        att.ready_at = time.time()
        att.outcome = "ready"
        with self._lock:
            self._endpoint = endpoint
        self._ready.set()
        self._set_state(GroupState.READY, f"ready at {endpoint.root}")
        self._fault.wait()
        if self._stop.is_set():
            return None
        with self._lock:
            reason = self._fault_reason or "a member of the group ended"
        att.ended_at = time.time()
        att.outcome = f"restarted: {reason}"
        self._set_state(GroupState.RESTARTING, f"{reason}; restarting every member")
        self._do_teardown()
        return AttemptEnd(att.ready_at, att.ended_at, reason)

    def _next(self, end: AttemptEnd, failures: int) -> Retry | GiveUp:
        failure = end.cause
        if isinstance(failure, LaunchFailure):  # never got ready
            if failure.fatal or failures >= self.policy.max_failures:
                why = "" if failure.fatal else f" ({failures} failed attempts in a row)"
                return GiveUp(failure.message + why, failure.hint)
            delay = self.policy.backoff(failures)
            self._set_state(
                GroupState.RESTARTING,
                f"{failure.message}; restarting every member in {delay:.1f} s",
            )
            return Retry(delay)
        if failures >= self.policy.max_failures:  # was ready, then a member failed
            return GiveUp(f"{failure} ({failures} times in a row)")
        return Retry(self.policy.backoff(failures))

    def _gave_up(self, number: int, verdict: GiveUp) -> None:
        err = EngineError(f"The {self.kind} failed: {verdict.message}", verdict.hint)
        with self._lock:
            self._error = err
        self._set_state(GroupState.FAILED, err.message, final=True)

    def _broke(self, number: int, exc: Exception) -> None:
        self._do_teardown()
        self._gave_up(number, GiveUp(f"k3desk could not run the {self.kind}: {exc}"))

    def _stopped(self, number: int) -> None:
        self._set_state(GroupState.STOPPING)
        self._do_teardown()
        self._set_state(GroupState.STOPPED)


def stop_remote_processes(procs: list[RemoteProcess], grace: float) -> None:
    """Stop every process of a group at once (each gets ``grace`` seconds to exit).

    In parallel, so a set of four ranks does not take four grace periods to stop.
    """
    for p in procs:
        p.stopping = True
    threads = [threading.Thread(target=p.stop, args=(grace,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(grace + 10)
