"""Launch llama-server and keep it running: states, load progress, crashes, restarts.

One :class:`Supervisor` owns one server.  It binds it to 127.0.0.1 on a free
port with a fresh random API key, runs it in its own process session with a
log file per launch and an in-memory tail, reports its state
(starting -> loading -> ready -> stopping -> stopped, or crashed), and on a
crash classifies it (:mod:`k3desk.core.engines.crash`) and restarts it with
back-off, re-planned where the cause says how (more expert layers in RAM after
a GPU out-of-memory, ``--no-repack`` after the AMX repack assertion, another
port when the port was taken).  The number of consecutive failed attempts is
bounded, and every attempt is kept in :attr:`Supervisor.history`.

Nothing is left behind, even when the app itself is killed with SIGKILL: the
server is a :class:`k3desk.core.process.Child` (its own session, PR_SET_PDEATHSIG
or a watchdog, SIGTERM then SIGKILL), spawned on the supervisor's own monitor
thread, which lives exactly as long as the child it watches.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import IO

from k3desk.core.engines.crash import CrashReport, classify_exit, load_timeout
from k3desk.core.engines.engine_args import arg_changes as arg_changes
from k3desk.core.engines.engine_args import bump_n_cpu_moe as bump_n_cpu_moe
from k3desk.core.engines.engine_args import describe_changes, redact
from k3desk.core.engines.identity import alive_pid as alive_pid
from k3desk.core.engines.identity import (
    authorized_status,
    family,
    health,
    owns_listener,
    remember_owner,
)
from k3desk.core.engines.identity import ownership_problem as ownership_problem
from k3desk.core.engines.loadprogress import BYTES_PROGRESS_MIN, LoadProgressParser, bytes_loaded
from k3desk.core.engines.oom import OomSnapshot, OomWatch
from k3desk.core.engines.ports import LOOPBACK, free_port, listener_names, listeners
from k3desk.core.engines.ports import port_problem as port_problem
from k3desk.core.errors import EngineError
from k3desk.core.hardware.nvidia import launch_env
from k3desk.core.paths import AppPaths
from k3desk.core.planning.argv import (
    NO_REPACK,
    SLOT_SAVE_PATH,
    endpoint_args,
    has,
    with_no_repack,
)
from k3desk.core.private import open_private, private_dir
from k3desk.core.process import Child, pump_thread, spawn
from k3desk.core.progress import Progress
from k3desk.core.supervision import (
    AttemptEnd,
    BackoffPolicy,
    GiveUp,
    Retry,
    SupervisedLaunch,
)

log = logging.getLogger(__name__)

_REPLANS = ("replan_cpu_moe", "no_repack")


class State(StrEnum):
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    CRASHED = "crashed"


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    api_key: str
    # the server process behind it and the attempt that started it (not part of what a
    # client connects to: a restart on the same port and key is the same endpoint)
    pid: int = field(default=0, compare=False)
    attempt: int = field(default=0, compare=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def fresh_api_key() -> str:
    """A random key for one launch (192 bits), never starting with "-": the key is printed
    for the person to paste after ``--api-key``, where a leading dash reads as an option."""
    while True:
        key = secrets.token_urlsafe(24)
        if not key.startswith("-"):
            return key


@dataclass(frozen=True)
class LaunchSpec:
    """What to run.  ``args`` are llama-server's arguments after the executable,
    without --host/--port/--api-key (e.g. ``LaunchPlan.server_args``)."""

    executable: Path
    args: tuple[str, ...]
    model_bytes: int = 0  # scales the ready timeout
    port: int | None = None  # None: a free port, changed if it gets taken
    api_key: str | None = None  # None: a fresh random key
    env: Mapping[str, str] | None = None  # extra environment variables
    ready_timeout: float | None = None  # None: scaled from model_bytes
    n_layers: int = 0  # the model's block count (bounds --n-cpu-moe); 0 = unknown
    # pass the key in a private file (--api-key-file) rather than on the command line,
    # where other local users can read it in /proc; needs an engine that has the flag
    api_key_file: bool = False
    # only web pages of this machine may read its answers (an engine with the CORS flags:
    # endpoint_args)
    local_cors: bool = False
    # the model's shards in order (load progress reads which of them are mapped)
    model_parts: tuple[Path, ...] = ()
    # keys the person's own tools use (core/engines/client_keys.py), accepted beside the
    # app's own key by every attempt, so a restart or re-plan keeps them working
    client_keys: tuple[str, ...] = field(default=(), repr=False)
    # what to do when ``port`` is taken, in the shell's words ("" = the CLI's --port)
    port_hint: str = ""
    # where it listens: 127.0.0.1, or every IPv4 interface (ANY_HOST) when the person let
    # other devices reach the local API; k3desk itself always talks to it over 127.0.0.1,
    # which either includes
    host: str = LOOPBACK
    # the one web origin (besides nothing) whose pages may read answers; needs local_cors
    cors_origin: str = ""
    # where the engine saves and restores conversations' states (--slot-save-path; made
    # private before each start): core/chat/kept_state.py; None = nothing kept
    state_dir: Path | None = None

    def timeout(self) -> float:
        """Seconds to wait for /health 200: 60 s plus the model read at 250 MB/s."""
        if self.ready_timeout is not None:
            return self.ready_timeout
        return 60.0 + self.model_bytes / 250e6


@dataclass(frozen=True)
class RestartPolicy(BackoffPolicy):
    """The shared back-off policy (k3desk.core.supervision) and what re-planning may do."""

    # restarts with new arguments (more expert layers in RAM, --no-repack); each one
    # changes something, so they have their own, larger bound
    max_replans: int = 10
    cpu_moe_step: int = 0  # extra expert layers to RAM per GPU OOM; 0 = about a tenth


@dataclass
class Attempt:
    """One launch of the server."""

    number: int
    argv: tuple[str, ...]  # with the API key redacted
    port: int
    log_file: Path
    pid: int = 0
    started_at: float = field(default_factory=time.time)
    ready_at: float | None = None
    ended_at: float | None = None
    returncode: int | None = None
    crash: CrashReport | None = None
    action: str = ""  # what the supervisor did next, in words
    # how this attempt's command differs from the one before ("" for the first)
    changes: str = ""

    @property
    def ready_seconds(self) -> float | None:
        return None if self.ready_at is None else self.ready_at - self.started_at


@dataclass(frozen=True)
class Event:
    state: State
    attempt: int
    message: str = ""
    progress: Progress | None = None
    final: bool = False  # CRASHED with no restart to follow


EventCallback = Callable[[Event], None]
LineCallback = Callable[[str], None]
# (crash, current args) -> (new args, what changed in words), or None if no re-plan
Replanner = Callable[[CrashReport, tuple[str, ...]], "tuple[tuple[str, ...], str] | None"]


# ------------------------------------------------------------ the supervisor
class Supervisor(SupervisedLaunch[Endpoint]):
    """One llama-server on the shared restart loop: an attempt is one server process."""

    kind = "llama-server"

    def __init__(
        self,
        spec: LaunchSpec,
        paths: AppPaths,
        *,
        policy: RestartPolicy | None = None,
        on_event: EventCallback | None = None,
        on_line: LineCallback | None = None,
        replan: Replanner | None = None,
        tail_lines: int = 400,
        oom_watch: OomWatch | None = None,
    ) -> None:
        self.policy: RestartPolicy = policy or RestartPolicy()
        super().__init__(self.policy)
        self.spec = spec
        self.paths = paths
        self._on_event = on_event
        self._on_line = on_line
        self._replan = replan or self._default_replan
        # where a SIGKILL's cause is looked up (the kernel's OOM traces)
        self._oom = oom_watch or OomWatch()
        self.api_key = spec.api_key or fresh_api_key()
        self._state = State.STOPPED
        self._child: Child | None = None
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._history: list[Attempt] = []
        self._last_crash: CrashReport | None = None
        self._progress = LoadProgressParser()
        # the command the next attempt runs, and what the one before ran
        self._args = tuple(spec.args)
        # the spec's port is read at the first attempt (a shell may complete the spec, off
        # its GUI thread, until start)
        self._port = 0
        self._previous: tuple[tuple[str, ...], int] | None = None
        self._replans = 0  # restarts with changed arguments (each one gets further)

    # -------------------------------------------------------------- public
    @property
    def state(self) -> State:
        with self._lock:
            return self._state

    @property
    def pid(self) -> int | None:
        with self._lock:
            child = self._child
        return child.pid if child is not None and child.poll() is None else None

    @property
    def history(self) -> list[Attempt]:
        with self._lock:
            return [replace(a) for a in self._history]

    @property
    def last_crash(self) -> CrashReport | None:
        with self._lock:
            return self._last_crash

    @property
    def log_file(self) -> Path | None:
        with self._lock:
            return self._history[-1].log_file if self._history else None

    def tail(self, n: int | None = None) -> list[str]:
        with self._lock:
            lines = list(self._tail)
        return lines if n is None else lines[-n:]

    def start(self) -> None:
        """Launch in the background; follow with :meth:`wait_ready`.

        A port given in the spec is checked first: out of range or already taken is an
        :class:`EngineError` here, before anything is started.
        """
        if self.spec.port is not None:
            problem, hint = port_problem(self.spec.port, self.spec.host)
            if problem:
                raise EngineError(problem, self.spec.port_hint or hint)
        super().start()

    def stop(self, grace: float | None = None) -> None:
        """Stop the server: SIGTERM to its group, wait, then SIGKILL.  Idempotent."""
        if grace is not None:
            self.policy = replace(self.policy, stop_grace=grace)
        super().stop()

    close = stop

    def __enter__(self) -> Supervisor:
        return self

    # -------------------------------------------------------------- internals
    def _final_error(self) -> EngineError:
        crash = self.last_crash
        where = f"See the log: {self.log_file}" if self.log_file else ""
        if crash is None:
            return EngineError("llama-server stopped before it was ready.", where)
        attempts = len(self.history)
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        return EngineError(
            f"llama-server failed{tries}: {crash.describe()}.",
            f"{crash.fix} {where}".strip(),
        )

    def _set_state(
        self, state: State, attempt: int, message: str = "", *, final: bool = False
    ) -> None:
        with self._lock:
            self._state = state
        progress = None
        if state is State.LOADING:
            progress = Progress("loading", self._progress.percent, 100, self._progress.phase)
        self._emit(Event(state, attempt, message, progress, final))

    def _emit(self, event: Event) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:  # a listener's bug must not kill the monitor
            log.exception("engine event listener failed")

    def _new_log_file(self, attempt: int) -> Path:
        private_dir(self.paths.logs_dir)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = f"llama-server-{stamp}-{os.getpid()}-{id(self) & 0xFFFF:04x}-a{attempt}"
        return self.paths.logs_dir / f"{base}.log"

    def _not_ready_error(self, timeout: float) -> EngineError:
        return EngineError(
            f"llama-server was not ready within {timeout:.0f} s (state: {self.state.value}).",
            f"See its log: {self.log_file}",
        )

    def _attempt(self, number: int) -> AttemptEnd | None:
        if not self._port:
            self._port = self.spec.port or free_port()
        args, port = self._args, self._port
        changes = "" if self._previous is None else describe_changes(*self._previous, args, port)
        self._previous = (args, port)
        attempt, crash = self._one_attempt(number, args, port, changes)
        if crash is None:  # stopped on request
            return None
        replanned = crash.recovery in _REPLANS or self._moves_port(crash)
        if replanned:
            self._replans += 1
        with self._lock:
            self._last_crash = crash
        ended = attempt.ended_at or time.time()
        return AttemptEnd(attempt.ready_at, ended, crash, counts=not replanned)

    def _next(self, end: AttemptEnd, failures: int) -> Retry | GiveUp:
        crash = end.cause
        assert isinstance(crash, CrashReport)
        decision = self._decide(crash, self._args, self._port, failures, self._replans)
        if isinstance(decision, GiveUp):
            return decision
        self._args, self._port, action = decision
        delay = self.policy.backoff(failures if end.counts else 1)
        with self._lock:
            attempt = self._history[-1]
            attempt.action = f"{action}; restarting in {delay:.1f} s"
        self._set_state(State.CRASHED, attempt.number, f"{crash.describe()}; {attempt.action}")
        return Retry(delay)

    def _gave_up(self, number: int, verdict: GiveUp) -> None:
        self._set_state(State.CRASHED, number, verdict.message, final=True)

    def _broke(self, number: int, exc: Exception) -> None:
        with self._lock:
            self._last_crash = CrashReport(
                "exited", f"k3desk could not run llama-server: {exc}", "", "none"
            )
        self._set_state(State.CRASHED, number, str(exc), final=True)

    def _stopped(self, number: int) -> None:
        self._set_state(State.STOPPED, number)

    def _moves_port(self, crash: CrashReport) -> bool:
        """A port k3desk picked itself was taken before the engine could listen on it
        (another program, or another engine started at the same moment, got the same
        free port): not the engine's failure, so it does not count towards
        ``max_failures``; another free port is picked, as often as re-plans may be."""
        return crash.recovery == "new_port" and self.spec.port is None

    def _decide(
        self, crash: CrashReport, args: tuple[str, ...], port: int, failures: int, replans: int
    ) -> tuple[tuple[str, ...], int, str] | GiveUp:
        """Next (args, port, what changed), or why to give up (state CRASHED, final)."""
        give_up = ""
        new_args, new_port, action = args, port, "restarting unchanged"
        if crash.recovery == "none":
            give_up = "restarting cannot fix this"
        elif self._moves_port(crash) and replans > self.policy.max_replans:
            give_up = f"{replans} free ports in a row were taken before the engine could use them"
        elif crash.recovery in _REPLANS and replans > self.policy.max_replans:
            give_up = f"{replans - 1} re-plans did not help"
        elif (
            crash.recovery not in _REPLANS
            and not self._moves_port(crash)
            and failures >= self.policy.max_failures
        ):
            give_up = f"{failures} failed attempts in a row"
        elif crash.recovery == "new_port":
            if self.spec.port is not None:
                give_up = f"port {port} was chosen explicitly"
            else:
                new_port = free_port()
                while new_port == port:
                    new_port = free_port()
                action = f"port {port} was taken, using {new_port}"
        elif crash.kind == "oom_killed" and not has(args, NO_REPACK):
            # a restart that changes what matters: repacked weights are anonymous memory
            # (planning/repack.py); mmap'd, the kernel can drop their pages instead
            new_args = with_no_repack(args)
            action = "added --no-repack (the out-of-memory killer ended it)"
        elif crash.recovery in _REPLANS:
            plan = self._replan(crash, args)
            if plan is None:
                give_up = "no plan with less GPU memory is left"
                if crash.recovery == "no_repack":
                    give_up = "--no-repack did not help"
            elif tuple(plan[0]) == tuple(args):
                # not a re-plan: the same command would fail the same way
                give_up = "re-planning left the command unchanged, so it would fail again"
            else:
                new_args, action = plan
        if give_up:
            with self._lock:
                if self._history:
                    self._history[-1].action = f"gave up: {give_up}"
            return GiveUp(f"{crash.describe()}. Gave up: {give_up}.")
        return new_args, new_port, action

    def _default_replan(
        self, crash: CrashReport, args: tuple[str, ...]
    ) -> tuple[tuple[str, ...], str] | None:
        if crash.recovery == "no_repack":
            if has(args, NO_REPACK):
                return None
            why = "AMX repack assertion" if crash.kind == "amx_repack_assert" else "out of RAM"
            return with_no_repack(args), f"added --no-repack ({why})"
        if crash.recovery == "replan_cpu_moe":
            return bump_n_cpu_moe(args, self.spec.n_layers, self.policy.cpu_moe_step)
        return None

    def _one_attempt(
        self, number: int, args: tuple[str, ...], port: int, changes: str = ""
    ) -> tuple[Attempt, CrashReport | None]:
        log_path = self._new_log_file(number)
        key_file = self._write_key_file(log_path) if self.spec.api_key_file else None
        argv = (
            str(self.spec.executable),
            *args,
            *endpoint_args(
                self.spec.host,
                port,
                # several keys: comma-separated (``--api-key``, common/arg.cpp), for an
                # engine without --api-key-file
                api_key=",".join(self._keys()),
                key_file=key_file,
                local_cors=self.spec.local_cors,
                cors_origin=self.spec.cors_origin,
            ),
            *self._state_args(),
        )
        try:
            return self._launch(number, argv, port, log_path, key_file, changes)
        finally:
            if key_file is not None:
                key_file.unlink(missing_ok=True)

    def _state_args(self) -> tuple[str, ...]:
        """--slot-save-path: a private folder, so no other user reads or plants a state."""
        folder = self.spec.state_dir
        if folder is None:
            return ()
        private_dir(folder)
        return (SLOT_SAVE_PATH.name, str(folder))

    def _keys(self) -> tuple[str, ...]:
        """The app's own key first, then the person's tools' keys."""
        return (self.api_key, *(k for k in self.spec.client_keys if k != self.api_key))

    def _write_key_file(self, log_path: Path) -> Path:
        path = self.paths.state / "run" / (log_path.stem + ".key")
        with open_private(path, "w") as f:
            f.write("".join(key + "\n" for key in self._keys()))
        return path

    def _launch(
        self,
        number: int,
        argv: tuple[str, ...],
        port: int,
        log_path: Path,
        key_file: Path | None,
        changes: str = "",
    ) -> tuple[Attempt, CrashReport | None]:
        attempt = Attempt(
            number, redact(argv, ",".join(self._keys())), port, log_path, changes=changes
        )
        with self._lock:
            self._history.append(attempt)
            self._endpoint = None
        self._progress = LoadProgressParser()
        self._ready.clear()
        started = ""
        if number > 1:
            started = f"changed: {changes}" if changes else "the same command again"
        self._set_state(State.STARTING, number, started)
        problem, hint = port_problem(port, self.spec.host)
        if problem:  # taken since it was chosen: start nothing that would trust it
            with open_private(log_path, "wb") as logf:
                logf.write(f"not started: {problem}\n".encode())
            attempt.ended_at = time.time()
            attempt.crash = CrashReport("port_in_use", problem, hint, "new_port")
            return attempt, attempt.crash
        env = {**os.environ, **launch_env(self.spec.env)}
        oom_before = self._oom.begin()
        try:
            return self._spawn(attempt, argv, port, log_path, key_file, env, oom_before)
        finally:
            oom_before.close()

    def _spawn(
        self,
        attempt: Attempt,
        argv: tuple[str, ...],
        port: int,
        log_path: Path,
        key_file: Path | None,
        env: dict[str, str],
        oom_before: OomSnapshot,
    ) -> tuple[Attempt, CrashReport | None]:
        number = attempt.number
        with open_private(log_path, "wb") as logf:
            # a path may hold undecodable bytes (lone surrogates): the log says them as escapes
            logf.write(("$ " + " ".join(attempt.argv) + "\n").encode("utf-8", "backslashreplace"))
            logf.flush()
            try:
                # spawned on the monitor thread, which lives exactly as long as the child
                child = spawn(argv, env=env)
            except OSError as exc:
                attempt.ended_at = time.time()
                crash = CrashReport(
                    "exited",
                    f"llama-server could not be started: {exc}",
                    "Check the engine path (`k3desk engine list`).",
                    "none",
                )
                attempt.crash = crash
                return attempt, crash
            proc = child.popen
            attempt.pid = proc.pid
            with self._lock:
                self._child = child
            reader = self._start_reader(child, logf, number)
            stopped_by_us = False
            timed_out = False
            try:
                stopped_by_us, timed_out = self._watch(proc, attempt, port, key_file)
            finally:
                child.stop(self.policy.stop_grace)
                reader.join(5.0)
                with self._lock:
                    self._child = None
        attempt.ended_at = time.time()
        attempt.returncode = proc.returncode
        if stopped_by_us:
            attempt.action = "stopped on request"
            return attempt, None
        tail = self.tail(60)
        if attempt.crash is not None:  # found while watching (see _verify)
            crash = attempt.crash
        elif timed_out:
            crash = load_timeout(self.spec.timeout(), tail)
        else:
            evidence = ""
            if proc.returncode == -signal.SIGKILL:
                try:
                    evidence = self._oom.evidence(oom_before, proc.pid)
                except Exception:  # a reader's bug must not hide the crash itself
                    log.exception("reading the OOM killer's traces failed")
            crash = classify_exit(proc.returncode, tail, oom_evidence=evidence)
        attempt.crash = crash
        return attempt, crash

    def _watch(
        self, proc: subprocess.Popen[bytes], attempt: Attempt, port: int, key_file: Path | None
    ) -> tuple[bool, bool]:
        """Wait for ready, then for exit.  Returns (stopped_by_us, timed_out)."""
        deadline = time.monotonic() + self.spec.timeout()
        next_bytes = 0.0
        interval = 0.02
        loading_announced = False
        while proc.poll() is None:
            if self._stop.is_set():
                self._set_state(State.STOPPING, attempt.number)
                self._terminate(proc)
                return True, False
            if attempt.ready_at is None:
                status = health(port)
                verdict = self._verify(proc, port) if status == 200 else None
                if isinstance(verdict, CrashReport):  # not ours, or our key is refused
                    attempt.crash = verdict
                    self._terminate(proc)
                    return False, False
                if verdict is True:
                    attempt.ready_at = time.time()
                    if key_file is not None:  # read at start-up; do not leave it lying around
                        key_file.unlink(missing_ok=True)
                    with self._lock:
                        self._endpoint = Endpoint(
                            LOOPBACK, port, self.api_key, proc.pid, attempt.number
                        )
                    self._set_state(
                        State.READY, attempt.number, f"ready at http://{LOOPBACK}:{port}"
                    )
                    self._ready.set()
                    continue
                if not loading_announced and (status is not None or self._progress.percent > 0):
                    loading_announced = True
                    self._set_state(State.LOADING, attempt.number, self._progress.phase)
                if self.spec.model_bytes >= BYTES_PROGRESS_MIN and time.monotonic() >= next_bytes:
                    next_bytes = time.monotonic() + 0.5
                    done = bytes_loaded(proc.pid, self.spec.model_parts)
                    if self._progress.feed_bytes(done, self.spec.model_bytes):
                        self._loading_progress(attempt.number)
                if time.monotonic() > deadline:
                    self._terminate(proc)
                    return False, True
                self._stop.wait(interval)
                interval = min(0.25, interval * 1.5)
            else:
                self._stop.wait(0.2)
        return self._stop.is_set(), False

    def _verify(self, proc: subprocess.Popen[bytes], port: int) -> bool | CrashReport | None:
        """Is what answered /health on ``port`` our server, and does it take our key?

        True: the listening socket belongs to our child (or its descendants) and our
        key was accepted on a connection that child is seen to hold.  None: not yet
        (listening is still to come; look again).  A CrashReport: something else
        listens there, or our server refuses the key; nobody is handed the endpoint.
        The key is only ever sent over a connection our child has accepted.
        """
        ours = family(proc.pid)
        foreign = [pid for pid in listeners(port) if pid not in ours]
        if foreign:
            who = listener_names(port)
            return CrashReport(
                "port_in_use",
                f"Another program listens on port {port} as well ({who}): what answers "
                "there is not only the engine k3desk started",
                "Stop that program, or give the local API another port (Settings > Local API, "
                "`k3desk api port N`; --port 0: a free one).",
                "new_port",
            )
        if not owns_listener(ours, port):
            return None
        status = authorized_status(ours, port, self.api_key)
        if status == 200:
            remember_owner(proc.pid, ours, port)
            return True
        if status in (401, 403):
            return CrashReport(
                "exited",
                f"llama-server on port {port} refused the API key k3desk gave it (HTTP {status})",
                "Check --api-key/--api-key-file among the engine arguments; k3desk passes "
                "its own key.",
                "none",
            )
        return None

    def _terminate(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the server's process group, wait, then SIGKILL."""
        with self._lock:
            child = self._child
        if child is not None and child.popen is proc:
            child.stop(self.policy.stop_grace)

    def _start_reader(self, child: Child, logf: IO[bytes], number: int) -> threading.Thread:
        """Pump the server's output into its log, the tail and the load progress."""
        assert child.stdout is not None
        secret = self.api_key.encode()

        def chunk(data: bytes) -> None:
            logf.write(data.replace(secret, b"***"))
            logf.flush()

        def partial(data: bytes) -> bool:
            dots = data.strip()
            if dots and set(dots) <= {ord(".")}:  # progress dots arrive without a newline
                if self._progress.feed_dots(len(dots)):
                    self._loading_progress(number)
                return True
            return False

        return pump_thread(
            child.stdout,
            lambda line: self._handle_line(line, number),
            name="llama-server-log",
            on_chunk=chunk,
            on_partial=partial,
        )

    def _handle_line(self, line: str, number: int) -> None:
        line = line.rstrip("\r").replace(self.api_key, "***")
        with self._lock:
            self._tail.append(line)
        if self._on_line is not None:
            try:
                self._on_line(line)
            except Exception:
                log.exception("engine log listener failed")
        if self.state in (State.STARTING, State.LOADING) and self._progress.feed_line(line):
            self._loading_progress(number)

    def _loading_progress(self, number: int) -> None:
        if self.state in (State.STARTING, State.LOADING):
            self._set_state(State.LOADING, number, self._progress.phase)
