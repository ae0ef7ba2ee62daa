"""The app's one engine: a core :class:`Supervisor` seen through Qt signals.

All process work (start, wait for ready, stop) runs through the task manager;
the supervisor's events and log lines arrive on its monitor thread and reach
widgets only through :mod:`k3desk.ui.bridge` objects.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal, Slot

from k3desk.core.engines.supervisor import (
    Endpoint,
    Event,
    LaunchSpec,
    Replanner,
    State,
    Supervisor,
)
from k3desk.core.errors import EngineError
from k3desk.core.tuning.calibration import Comparison, SpeedTracker
from k3desk.core.tuning.metrics import SpeedWatcher
from k3desk.ui.bridge import Relay, StreamBuffer

if TYPE_CHECKING:
    from k3desk.core.app.subject import Subject
    from k3desk.core.chat.client import ChatEndpoint
    from k3desk.core.planning.model import LaunchPlan
    from k3desk.ui.cluster.controller import ClusterController
    from k3desk.ui.context import AppContext

log = logging.getLogger(__name__)

STATE_TEXT = {
    "not started": "Engine: not running",
    State.STARTING.value: "Engine: starting…",
    State.LOADING.value: "Engine: loading the model…",
    State.READY.value: "Engine: ready",
    State.STOPPING.value: "Engine: stopping…",
    State.STOPPED.value: "Engine: stopped",
    State.CRASHED.value: "Engine: crashed",
}


@dataclass(frozen=True)
class LaunchRequest:
    """What the engine is (to be) started with, as the views describe it."""

    spec: LaunchSpec
    plan: LaunchPlan | None = None
    model_name: str = ""
    vision: bool = False  # started with a projector (--mmproj)
    replan: Replanner | None = None  # how to re-plan after a GPU out-of-memory
    notes: tuple[str, ...] = ()  # warnings the launch carries (a suspicious shard set)
    subject: Subject | None = None  # the machine the plan was made for (this one)
    # compares what the engine measures with the plan's prediction, and keeps it
    tracker: SpeedTracker | None = None


class EngineController(QObject):
    """Signals:
    state_changed(str, str): state value and message ("ready", "Listening on ...").
    progress(object): a core Progress while the model loads.
    log_lines(str): new log text (several lines, throttled to 10 Hz).
    attempts_changed(): the attempt history changed (a start, a crash, a restart).
    launched(object): a new LaunchRequest was started.
    failed(str, str): the engine gave up: message, hint.
    measured(object): a calibration Comparison: what the engine's answers measured,
        next to the prediction (after each stretch of answers).
    """

    state_changed = Signal(str, str)
    progress = Signal(object)
    log_lines = Signal(str)
    attempts_changed = Signal()
    launched = Signal(object)
    failed = Signal(str, str)
    measured = Signal(object)

    def __init__(self, ctx: AppContext, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.supervisor: Supervisor | None = None
        self.request: LaunchRequest | None = None
        self._state = "not started"
        self._message = ""
        self._events = Relay(self)
        self._events.fired.connect(self._on_event)
        self._lines = StreamBuffer(hz=10, parent=self)
        self._lines.batch.connect(self._on_lines)
        self._wait_task: Any = None
        # a second place the chat can go when no local engine runs (cluster engines,
        # attached servers)
        self._external: ClusterController | None = None
        self._watcher: SpeedWatcher | None = None
        self._speeds = Relay(self)
        self._speeds.fired.connect(self._on_speed)
        self.last_measured: Comparison | None = None

    def set_external(self, source: ClusterController) -> None:
        """Let ``source`` serve the chat when no local engine runs; its changes are
        announced as :attr:`state_changed`."""
        self._external = source
        source.changed.connect(lambda: self.state_changed.emit(self._state, self._message))

    # ------------------------------------------------------------ state
    def state_name(self) -> str:
        return self._state

    def state_text(self) -> str:
        text = STATE_TEXT.get(self._state, f"Engine: {self._state}")
        if self._external is not None and not self.running:
            return self._external.state_text() or text
        return text

    @property
    def message(self) -> str:
        return self._message

    @property
    def running(self) -> bool:
        return self._state in (State.STARTING.value, State.LOADING.value, State.READY.value)

    @property
    def ready(self) -> bool:
        return self._state == State.READY.value

    def endpoint(self) -> Endpoint | None:
        sup = self.supervisor
        return sup.endpoint if sup is not None and self.ready else None

    def chat_endpoint(self) -> ChatEndpoint | None:
        """Where the chat sends requests: the local engine when ready, else a cluster engine
        or the attached server chosen on the Cluster page."""
        from k3desk.core.chat.client import ChatEndpoint

        ep = self.endpoint()
        if ep is not None:
            return ChatEndpoint(ep.url, ep.api_key)
        if self._external is not None:
            return self._external.chat_endpoint()
        return None

    def attempts(self) -> list[Any]:
        return self.supervisor.history if self.supervisor is not None else []

    def tail(self) -> list[str]:
        return self.supervisor.tail() if self.supervisor is not None else []

    # ---------------------------------------------------------- actions
    def launch(self, request: LaunchRequest) -> None:
        """Start the engine described by ``request`` (stopping a running one first)."""
        self._unwatch()
        self.last_measured = None
        old = self.supervisor
        self.request = request
        sup = Supervisor(
            request.spec,
            self.ctx.services.paths,
            on_event=self._events,
            on_line=lambda line: self._lines.append("line", line + "\n"),
            replan=request.replan,
        )
        self.supervisor = sup
        self._set_state(State.STARTING.value, "Starting llama-server…")
        self.launched.emit(request)

        def work(token: Any) -> Endpoint:
            if old is not None:
                old.stop()
            sup.start()
            return sup.wait_ready(cancel=token)

        def done(ep: Endpoint) -> None:
            if sup is self.supervisor:
                self._set_state(State.READY.value, f"Listening on {ep.url}")
                self._watch(request, ep)
            self.attempts_changed.emit()

        def error(exc: BaseException) -> None:
            if sup is not self.supervisor:
                return
            message, hint = (
                (exc.message, exc.hint) if isinstance(exc, EngineError) else (str(exc), "")
            )
            self._set_state(State.CRASHED.value, message)
            self.failed.emit(message, hint)
            self.attempts_changed.emit()

        self._wait_task = self.ctx.tasks.run(work, on_done=done, on_error=error, name="engine")

    def stop(self) -> None:
        sup = self.supervisor
        if sup is None:
            return
        self._unwatch()
        if self._wait_task is not None:
            self._wait_task.cancel()
        self._set_state(State.STOPPING.value, "Stopping llama-server…")
        self.ctx.tasks.run(
            lambda _t: sup.stop(),
            on_done=lambda _r: self._stopped(sup),
            name="engine-stop",
        )

    def restart(self) -> None:
        if self.request is not None:
            self.launch(self.request)

    def close(self) -> None:
        """Stop the engine now (blocking; app exit)."""
        self._unwatch()
        sup, self.supervisor = self.supervisor, None
        if sup is not None:
            sup.stop()

    # --------------------------------------------------------- internals
    def _watch(self, request: LaunchRequest, ep: Endpoint) -> None:
        """Read the engine's own speed counters while it runs (calibration)."""
        tracker = request.tracker
        if tracker is None:
            return
        # the relay carries each comparison from the watcher's thread to this one
        self._watcher = tracker.watch(ep.url, ep.api_key, self._speeds)

    def _unwatch(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop(wait=False)

    @Slot(object)
    def _on_speed(self, comparison: Comparison) -> None:
        self.last_measured = comparison
        self.measured.emit(comparison)

    def _stopped(self, sup: Supervisor) -> None:
        if sup is self.supervisor:
            self._set_state(State.STOPPED.value, "Stopped.")
            self.attempts_changed.emit()

    def _set_state(self, state: str, message: str) -> None:
        self._state = state
        self._message = message
        self.state_changed.emit(state, message)

    @Slot(object)
    def _on_event(self, event: Event) -> None:
        if self.supervisor is None:
            return
        state = event.state.value
        if state == State.READY.value:
            ep = self.supervisor.endpoint
            message = f"Listening on {ep.url}" if ep else "Ready."
        else:
            message = event.message
        if event.progress is not None:
            self.progress.emit(event.progress)
        if state != self._state or message != self._message:
            # a stop we asked for is not a crash
            if state == State.CRASHED.value and self._state == State.STOPPING.value:
                return
            self._set_state(state, message)
        if state in (State.STARTING.value, State.CRASHED.value, State.READY.value):
            self.attempts_changed.emit()

    @Slot(object)
    def _on_lines(self, batch: dict[str, Any]) -> None:
        text = batch.get("line", "")
        if text:
            self.log_lines.emit(text)

