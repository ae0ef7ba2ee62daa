"""The app's one engine: a core :class:`Supervisor` seen through Qt signals.

All process work (start, wait for ready, stop) runs through the task manager;
the supervisor's events and log lines arrive on its monitor thread and reach
widgets only through :mod:`k3desk.ui.bridge` objects.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from k3desk.core.app import background
from k3desk.core.app.background import LAST_MODEL_KEY, BackgroundEngine, LastModel
from k3desk.core.app.engine_choice import NO_ENGINE_HINT
from k3desk.core.app.engines import (
    Comparison,
    DoesNotFitError,
    Endpoint,
    Event,
    LaunchSpec,
    NoEngineError,
    Replanner,
    SpeedTracker,
    SpeedWatcher,
    State,
    Supervisor,
    alive_pid,
    prepare_settings_launch,
)
from k3desk.core.app.local_api import BIND_WAIT, AppFront
from k3desk.core.app.operations import Change, OpChanges, Operation
from k3desk.core.app.values import CancelToken, EngineError
from k3desk.ui.bridge import Relay, StreamBuffer

if TYPE_CHECKING:
    from k3desk.core.app.chat import ChatEndpoint
    from k3desk.core.app.engines import LaunchPlan
    from k3desk.core.app.launch import LocalLaunch
    from k3desk.core.app.subject import Subject
    from k3desk.ui.cluster.controller import ClusterController
    from k3desk.ui.context import AppContext

log = logging.getLogger(__name__)
ENGINE = OpChanges.of(Change.ENGINE)

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
    shard: Path | None = None  # the model's first shard, remembered for "Relaunch"
    mmproj: Path | None = None
    # another model replaces the one running and the person chose to go on with the
    # conversation open (else the chat starts a new one for it)
    continue_chat: bool = False


def prepare_engine_request(
    ctx: AppContext, shard: Path, mmproj: Path | None, token: CancelToken
) -> LaunchRequest:
    """The local launch of ``shard`` with the app's settings (shard set checked, engine
    probed, planned for this machine, whatever the pages judge), as the views show it."""
    try:
        launch = prepare_settings_launch(ctx.services, ctx.settings, shard, mmproj, cancel=token)
    except NoEngineError as exc:
        raise NoEngineError(
            exc.message,
            NO_ENGINE_HINT,
        ) from None
    except DoesNotFitError as exc:
        raise DoesNotFitError(
            exc.message, "Choose a smaller tier in the wizard.", exc.plan
        ) from None
    return request_of(launch, shard, mmproj)


def request_of(launch: LocalLaunch, shard: Path, mmproj: Path | None) -> LaunchRequest:
    """What the engine controller starts for a prepared launch."""
    prepared = launch.prepared
    return LaunchRequest(
        prepared.spec(),
        launch.plan,
        launch.model_name,
        vision=mmproj is not None,
        replan=prepared.replan_after_oom,
        notes=prepared.notes,
        subject=launch.subject,
        tracker=launch.tracker,
        shard=shard,
        mmproj=mmproj,
    )


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
    engines_found(object, object): a probe's engine rows and this machine (every panel
        showing engines shows the latest probe, so none keeps a stale "none found").
    """

    state_changed = Signal(str, str)
    progress = Signal(object)
    log_lines = Signal(str)
    attempts_changed = Signal()
    launched = Signal(object)
    failed = Signal(str, str)
    measured = Signal(object)
    engines_found = Signal(object, object)

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
        # an engine an earlier k3desk kept running in the background, taken up here
        self.background: BackgroundEngine | None = None
        self._bg_timer = QTimer(self)
        self._bg_timer.setInterval(2000)
        self._bg_timer.timeout.connect(self._check_background)
        self.keeping = False  # this process keeps its engine for a later start
        self._was_ready = False  # the current launch has been ready once
        self._past: list[Any] = []  # the attempts of earlier launches (kept on relaunch)
        # the local API's address, across launches; its lines (a tool's conversation kept
        # or brought back) go to the engine's log
        self.api = AppFront(ctx.services, say=lambda line: self._lines.append("line", line + "\n"))
        # what must be done with the engine before it stops (run off the GUI thread when
        # the person stops or replaces it, on it when the app exits): the chat's last
        # answer kept in the engine's state
        self.before_stop: list[Callable[[], object]] = []
        self._behind: Callable[[], Endpoint | None] = lambda: None  # what it holds for

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

    def model_text(self) -> str:
        """Which model the chat talks to, for the chat's header ("" when none)."""
        if self.ready and self.model_name():
            where = "this machine, kept in the background" if self.background else "this machine"
            return f"{self.model_name()} · {where}"
        if self._external is not None and not self.running:
            return self._external.model_text()
        return ""

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
        if self.background is not None:
            return self.background.endpoint() if self.ready else None
        sup = self.supervisor
        return sup.endpoint if sup is not None and self.ready else None

    def address(self) -> str | None:
        """Where the person's tools reach the engine that is ready: the local API's address
        where this process's front holds it, else the engine's own (None while none is)."""
        ep = self.endpoint()
        if ep is None:
            return None
        if self.background is not None:
            return self.background.address or ep.url  # the keeper's front
        return self.api.url or ep.url

    @property
    def local(self) -> bool:
        """A local engine runs (started here, or taken up from the background)."""
        return self.running and (self.supervisor is not None or self.background is not None)

    def model_name(self) -> str:
        if self.background is not None:
            return self.background.model_name
        return self.request.model_name if self.request is not None else ""

    def last_model(self) -> LastModel | None:
        """The model launched last (None when none, or its files are gone)."""
        last = LastModel.from_json(self.ctx.settings.recent.get(LAST_MODEL_KEY))
        return last if last is not None and last.available() else None

    def chat_endpoint(self) -> ChatEndpoint | None:
        """Where the chat sends requests: the local engine when ready, else a cluster engine
        or the attached server chosen on the Cluster page."""
        from k3desk.core.app.chat import ChatEndpoint

        ep = self.endpoint()
        if ep is not None:
            return ChatEndpoint(ep.url, ep.api_key, owner_pid=ep.pid)
        if self._external is not None:
            return self._external.chat_endpoint()
        return None

    def attempts(self) -> list[Any]:
        """Every attempt of this session, earlier launches' first (a relaunch keeps them)."""
        now = self.supervisor.history if self.supervisor is not None else []
        return [*self._past, *now]

    def tail(self) -> list[str]:
        return self.supervisor.tail() if self.supervisor is not None else []

    # ---------------------------------------------------------- actions
    def launch(self, request: LaunchRequest) -> None:
        """Start the engine described by ``request`` (stopping a running one first)."""
        self._unwatch()
        self._was_ready = False
        self.last_measured = None
        old = self.supervisor
        if old is not None:
            self._past = [*self._past, *old.history][-50:]
        kept, self.background = self.background, None
        self._bg_timer.stop()
        paths = self.ctx.services.paths
        self.request = request
        sup = Supervisor(
            request.spec,
            self.ctx.services.paths,
            on_event=self._events,
            on_line=lambda line: self._lines.append("line", line + "\n"),
            replan=request.replan,
        )
        self.supervisor = sup
        self._behind = behind = self._engine_of(sup)
        self._set_state(State.STARTING.value, "Starting llama-server…")
        self.launched.emit(request)

        def work(token: Any) -> Endpoint:
            if old is not None:
                self._before_stop()
                old.stop()
            if kept is not None:
                background.stop(paths, kept)
            # the local API's fixed port, held by this process's front across launches, and
            # the person's tools' keys (the keyring is read here, off the GUI thread); a
            # launch with a port of its own keeps it
            if request.spec.port is None:
                wait = BIND_WAIT if kept is not None else 0.0  # its keeper's front lets go
                sup.spec = self.api.place(request.spec, self.ctx.settings, behind, wait=wait)
            else:
                self.api.stop()
            sup.start()
            return sup.wait_ready(cancel=token)

        def done(ep: Endpoint) -> None:
            if sup is self.supervisor:
                self._was_ready = True
                self._set_state(State.READY.value, self._listening(ep))
                self._watch(request, ep)
                self._remember(request, sup)
            self.attempts_changed.emit()

        def error(exc: BaseException) -> None:
            if sup is not self.supervisor:
                return
            message, hint = (
                (exc.message, exc.hint) if isinstance(exc, EngineError) else (str(exc), "")
            )
            self._let_go(behind)  # no engine will come: tools are refused, not told to wait
            self._set_state(State.CRASHED.value, message)
            self.failed.emit(message, hint)
            self.attempts_changed.emit()

        op = Operation("engine", work, ENGINE)
        self._wait_task = self.ctx.ops.run(op, on_success=done, on_failure=error)

    def stop(self) -> None:
        kept = self.background
        if kept is not None:
            self._bg_timer.stop()
            self._set_state(State.STOPPING.value, "Stopping the engine kept in the background…")
            paths = self.ctx.services.paths
            self.ctx.ops.run(
                Operation("engine-stop", lambda _t: background.stop(paths, kept), ENGINE),
                on_success=lambda _r: self._background_ended(kept, ""),
            )
            return
        sup = self.supervisor
        if sup is None:
            return
        self._unwatch()
        if self._wait_task is not None:
            self._wait_task.cancel()
        self._set_state(State.STOPPING.value, "Stopping llama-server…")

        def stopping(_t: Any) -> None:
            self._before_stop()
            sup.stop()
            self.api.stop()  # stopped by the person: the address goes with it

        self.ctx.ops.run(
            Operation("engine-stop", stopping, ENGINE),
            on_success=lambda _r: self._stopped(sup),
        )

    def restart(self) -> None:
        if self.request is not None:
            self.launch(self.request)

    def relaunch_last(self, on_error: Any = None) -> LastModel | None:
        """Check, plan and launch the model launched last (one click from the chat)."""
        last = self.last_model()
        if last is None:
            return None
        mmproj = Path(last.mmproj) if last.mmproj else None
        self.ctx.ops.run(
            Operation(
                "prepare-launch",
                lambda t: prepare_engine_request(self.ctx, Path(last.shard), mmproj, t),
            ),
            on_success=self.launch,
            on_failure=on_error,
        )
        return last

    # ------------------------------------------------------- background
    def take_up_background(self) -> None:
        """Take up the engine an earlier k3desk kept running, once it passes the checks
        (in the background; :attr:`state_changed` says when)."""
        if self.running:
            return
        paths = self.ctx.services.paths

        def done(result: tuple[BackgroundEngine | None, str]) -> None:
            rec, why = result
            if why:
                log.info("not taking up the kept engine: %s", why)
            if rec is None or self.running:
                return
            self.background = rec
            self._show_kept_launch(rec)
            url = rec.address or rec.endpoint().url
            self._set_state(State.READY.value, f"Listening on {url}: {rec.describe()}")
            self._bg_timer.start()

        self.ctx.ops.run(
            Operation("engine-take-up", lambda _t: background.take_up(paths)), on_success=done
        )

    def keep_in_background(self) -> bool:
        """Leave the engine running when the window closes (this process keeps it, without
        a window, for the next start to take up).  False when there is none to keep."""
        sup = self.supervisor
        ep = sup.endpoint if sup is not None else None
        if self.background is not None:
            return True  # kept already, by another process
        if sup is None or ep is None:
            return False
        self.keeping = True
        self._write_record(ep)
        return True

    def stop_keeping(self) -> None:
        """The window of the process keeping the engine opened again: the engine is this
        window's again (the record that it is kept goes until the next close keeps it)."""
        if self.keeping:
            self.keeping = False
            background.forget(self.ctx.services.paths, os.getpid())

    def stop_background_now(self) -> None:
        """Stop the engine taken up from the background and wait for it (app exit)."""
        kept, self.background = self.background, None
        self._bg_timer.stop()
        if kept is not None:
            background.stop(self.ctx.services.paths, kept)
            self._set_state(State.STOPPED.value, "")

    def _write_record(self, ep: Endpoint) -> None:
        background.keep(
            self.ctx.services.paths,
            BackgroundEngine(
                keeper_pid=os.getpid(),
                pid=ep.pid,
                port=ep.port,
                api_key=ep.api_key,
                model_name=self.model_name(),
                since=time.time(),
                address=self.api.url or "",
            ),
        )
        self._write_kept_launch()

    def _write_kept_launch(self) -> None:
        """What the kept engine was launched with, for the next start's Engine page."""
        from k3desk.core.app.kept_launch import KeptLaunch, remember_kept_launch

        req = self.request
        if req is None:
            return
        launch = KeptLaunch(
            os.getpid(),
            str(req.spec.executable),
            tuple(req.spec.args),
            req.model_name,
            str(req.shard or ""),
            str(req.mmproj or ""),
            req.plan,
        )
        try:
            remember_kept_launch(self.ctx.services.paths, launch)
        except OSError as exc:  # advisory: the engine is kept all the same
            log.warning("could not write what the kept engine runs: %s", exc)

    def _show_kept_launch(self, rec: BackgroundEngine) -> None:
        """The taken-up engine's launch (plan, command, model), as if launched here."""
        from k3desk.core.app.kept_launch import read_kept_launch

        launch = read_kept_launch(self.ctx.services.paths, rec.keeper_pid)
        if launch is None:
            return
        self.request = LaunchRequest(
            LaunchSpec(Path(launch.executable), launch.args),
            launch.plan,
            launch.model_name or rec.model_name,
            vision=bool(launch.mmproj),
            shard=Path(launch.shard) if launch.shard else None,
            mmproj=Path(launch.mmproj) if launch.mmproj else None,
        )
        self.launched.emit(self.request)

    def _check_background(self) -> None:
        kept = self.background
        if kept is not None and not alive_pid(kept.pid):
            self._background_ended(kept, "The engine kept in the background has stopped.")

    def _background_ended(self, kept: BackgroundEngine, message: str) -> None:
        if self.background is kept:
            self.background = None
            self._bg_timer.stop()
            self._set_state(State.STOPPED.value, message)

    def _remember(self, request: LaunchRequest, sup: Supervisor) -> None:
        """Remember what was launched and how long it took, for "Relaunch" next time."""
        if request.shard is None:
            return
        last_try = sup.history[-1] if sup.history else None
        ready = last_try.ready_seconds if last_try is not None else None
        entry = LastModel(
            str(request.shard),
            str(request.mmproj or ""),
            request.model_name,
            request.spec.model_bytes,
            round(ready, 1) if ready is not None else None,
        )
        self.ctx.remember(**{LAST_MODEL_KEY: entry.to_json()})

    def close(self) -> None:
        """Stop the engine now (blocking; app exit), unless it is kept for a later start."""
        self._unwatch()
        self._bg_timer.stop()
        sup, self.supervisor = self.supervisor, None
        if sup is not None:
            self._before_stop()
            sup.stop()
        self.api.stop()
        if self.keeping:
            background.forget(self.ctx.services.paths, os.getpid())

    # --------------------------------------------------------- internals
    def _before_stop(self) -> None:
        """What is kept before the engine stops: the chat's last answer, and a tool's
        conversation answered last (the local API's)."""
        for hook in list(self.before_stop):
            hook()
        self.api.flush()

    def _watch(self, request: LaunchRequest, ep: Endpoint) -> None:
        """Read the engine's own speed counters while it runs (calibration)."""
        tracker = request.tracker
        if tracker is None:
            return
        # the relay carries each comparison from the watcher's thread to this one
        self._watcher = tracker.watch(ep.url, ep.api_key, self._speeds, pid=ep.pid)

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
            self._set_state(State.STOPPED.value, "")
            self.attempts_changed.emit()

    @staticmethod
    def _engine_of(sup: Supervisor) -> Callable[[], Endpoint | None]:
        return lambda: sup.endpoint

    def _listening(self, ep: Endpoint) -> str:
        return f"Listening on {self.api.url or ep.url}"

    def _let_go(self, behind: Callable[[], Endpoint | None]) -> None:
        """The local API's address goes with a launch that failed or gave up, unless a
        later launch holds it already (off the GUI thread: the front's threads end)."""
        self.ctx.ops.run(Operation("engine-let-go", lambda _t: self.api.let_go(behind), ENGINE))

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
            message = self._listening(ep) if ep else "Ready."
            if ep is not None and self._watcher is not None and self.request is not None:
                # restarted: the old watcher ended with its process; watch the new one
                self._unwatch()
                self._watch(self.request, ep)
            if ep is not None and self.keeping:  # restarted: on a new port, with a new key
                self._write_record(ep)
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
        if event.state is State.CRASHED and event.final and self._was_ready:
            # given up after it had been ready (the launch's own wait reports the rest):
            # a process keeping the engine without a window has nothing left to keep
            self._unwatch()
            self._let_go(self._behind)
            self.failed.emit(message, "")

    @Slot(object)
    def _on_lines(self, batch: dict[str, Any]) -> None:
        text = batch.get("line", "")
        if text:
            self.log_lines.emit(text)
