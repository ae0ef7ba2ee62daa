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

Nothing is left behind, even when the app itself is killed with SIGKILL:

* the server runs in its own session, so stopping signals the whole group
  (SIGTERM, a grace period, then SIGKILL);
* on Linux the child asks the kernel, between fork and exec, to SIGKILL it
  when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``).  The kernel's
  notion of "parent" is the *thread* that forked, so every spawn happens on
  the supervisor's own monitor thread, which lives exactly as long as the
  child it watches.  The child also checks that its parent did not die before
  the prctl took effect.
* where prctl does not exist (macOS, BSD) a tiny watchdog process polls the
  app's pid and kills the server's group once the app is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import http.client
import logging
import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import IO

import psutil

from k3desk.core.engines.crash import CrashReport, classify_exit, load_timeout, strip_log_prefix
from k3desk.core.engines.oom import OomSnapshot, OomWatch
from k3desk.core.errors import Cancelled, EngineError
from k3desk.core.hardware.nvidia import launch_env
from k3desk.core.paths import AppPaths
from k3desk.core.private import open_private, private_dir
from k3desk.core.progress import CancelToken, Progress
from k3desk.core.units import fmt_bytes

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_REPLANS = ("replan_cpu_moe", "no_repack")
_PR_SET_PDEATHSIG = 1


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

    def timeout(self) -> float:
        """Seconds to wait for /health 200: 60 s plus the model read at 250 MB/s."""
        if self.ready_timeout is not None:
            return self.ready_timeout
        return 60.0 + self.model_bytes / 250e6


@dataclass(frozen=True)
class RestartPolicy:
    max_failures: int = 3  # consecutive failed attempts before giving up
    # restarts with new arguments (more expert layers in RAM, --no-repack); each one
    # changes something, so they have their own, larger bound
    max_replans: int = 10
    backoff_initial: float = 1.0  # seconds before the first restart
    backoff_factor: float = 2.0
    backoff_max: float = 30.0
    # a server that has been ready this long has its failure count reset, so one
    # crash a day does not use up the budget, while a crash loop still ends
    stable_after: float = 300.0
    cpu_moe_step: int = 0  # extra expert layers to RAM per GPU OOM; 0 = about a tenth
    stop_grace: float = 10.0  # seconds between SIGTERM and SIGKILL

    def backoff(self, failures: int) -> float:
        delay = self.backoff_initial * self.backoff_factor ** max(0, failures - 1)
        return float(min(self.backoff_max, delay))


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


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_problem(port: object, host: str = LOOPBACK) -> tuple[str, str]:
    """(what is wrong, what to do) when llama-server cannot listen on ``port``; ("", "") if
    it can.  Checked before every launch: a port that is out of range or already taken is
    refused then, instead of trusting whatever answers on it."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return (
            f"Port {port} is out of range: a TCP port is a number from 1 to 65535.",
            "Pass a free port with --port, or leave --port out to use a free one.",
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as llama-server binds (SO_REUSEADDR, server-http.cpp): connections of an earlier
        # server still in TIME_WAIT do not count, a listening socket does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except PermissionError:
            return (
                f"Port {port} on {host} needs administrator rights (ports below 1024 are "
                "privileged).",
                "Use a port from 1024 up, or leave --port out to use a free one.",
            )
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return (f"Port {port} on {host} cannot be used: {exc.strerror or exc}.", "")
            who = _listener_names(port)
            return (
                f"Port {port} on {host} is already in use{' by ' + who if who else ''}.",
                "Stop that program, choose another port with --port, or leave --port out to "
                "use a free one.",
            )
    return "", ""


def check_port(port: int, host: str = LOOPBACK) -> None:
    """Raise :class:`EngineError` when llama-server could not listen on ``port``."""
    problem, hint = port_problem(port, host)
    if problem:
        raise EngineError(problem, hint)


def _listeners(port: int) -> list[int | None]:
    """Pids of the processes listening on TCP ``port`` (None: one this user cannot see)."""
    try:
        conns = psutil.net_connections("tcp")
    except (psutil.AccessDenied, OSError):
        return []
    return [c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def _listener_names(port: int) -> str:
    names = []
    for pid in _listeners(port):
        if pid is None:
            names.append("a process of another user")
            continue
        try:
            names.append(f"{psutil.Process(pid).name()} (pid {pid})")
        except psutil.Error:
            names.append(f"pid {pid}")
    return ", ".join(dict.fromkeys(names))


def redact(argv: Sequence[str], secret: str) -> tuple[str, ...]:
    return tuple("***" if a == secret else a for a in argv)


# ------------------------------------------------------------ load progress
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
        lo, hi = _TENSOR_SPAN
        pct = lo + int((hi - lo) * min(1.0, done / total))
        if pct > self.percent:
            self.percent = pct
            self.phase = f"loading tensors ({fmt_bytes(done)} of {fmt_bytes(total)})"
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


# ------------------------------------------------------------ child setup
def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()


def _make_preexec(parent_pid: int) -> Callable[[], None] | None:
    libc = _LIBC
    if libc is None:
        return None
    prctl = libc.prctl

    def setup() -> None:  # runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return setup


_WATCHDOG = r"""
import os, signal, sys, time
app, pgid = int(sys.argv[1]), int(sys.argv[2])
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
while True:
    time.sleep(0.5)
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        sys.exit(0)
    if not alive(app):
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                sys.exit(0)
            end = time.time() + wait
            while time.time() < end:
                time.sleep(0.1)
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    sys.exit(0)
        sys.exit(0)
"""


def _start_watchdog(pgid: int) -> subprocess.Popen[bytes] | None:
    """Where PR_SET_PDEATHSIG does not exist: a watchdog that outlives a killed app."""
    if _LIBC is not None:
        return None
    return subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(pgid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


# ------------------------------------------------------------ the supervisor
class Supervisor:
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
        self.spec = spec
        self.paths = paths
        self.policy = policy or RestartPolicy()
        self._on_event = on_event
        self._on_line = on_line
        self._replan = replan or self._default_replan
        # where a SIGKILL's cause is looked up (the kernel's OOM traces)
        self._oom = oom_watch or OomWatch()
        self.api_key = spec.api_key or secrets.token_urlsafe(24)
        self._lock = threading.Lock()
        self._state = State.STOPPED
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._history: list[Attempt] = []
        self._endpoint: Endpoint | None = None
        self._last_crash: CrashReport | None = None
        self._progress = LoadProgressParser()

    # -------------------------------------------------------------- public
    @property
    def state(self) -> State:
        with self._lock:
            return self._state

    @property
    def endpoint(self) -> Endpoint | None:
        with self._lock:
            return self._endpoint

    @property
    def pid(self) -> int | None:
        with self._lock:
            proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

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
        if self._thread is not None:
            raise EngineError("This server was already started; create a new supervisor.")
        if self.spec.port is not None:
            check_port(self.spec.port)
        self._thread = threading.Thread(target=self._run, name="llama-server-monitor", daemon=True)
        self._thread.start()

    def wait_ready(
        self, timeout: float | None = None, cancel: CancelToken | None = None
    ) -> Endpoint:
        """Block until the server answers /health with 200 (through restarts).

        Raises :class:`EngineError` with the classified cause when it gives up,
        and :class:`Cancelled` (after stopping the server) when ``cancel`` fires.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._ready.is_set():
                ep = self.endpoint
                if ep is not None:
                    return ep
            if self._done.is_set():
                raise self._final_error()
            if cancel is not None and cancel.cancelled:
                self.stop()
                raise Cancelled()
            if deadline is not None and time.monotonic() > deadline:
                raise EngineError(
                    f"llama-server was not ready within {timeout:.0f} s "
                    f"(state: {self.state.value}).",
                    f"See its log: {self.log_file}",
                )
            self._ready.wait(0.05)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def stop(self, grace: float | None = None) -> None:
        """Stop the server: SIGTERM to its group, wait, then SIGKILL.  Idempotent."""
        if grace is not None:
            self.policy = replace(self.policy, stop_grace=grace)
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.policy.stop_grace + 10.0)

    close = stop

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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

    def _run(self) -> None:
        args = tuple(self.spec.args)
        port = self.spec.port or free_port()
        previous: tuple[tuple[str, ...], int] | None = None
        failures = 0  # consecutive failed attempts that changed nothing
        replans = 0  # restarts with changed arguments (each one gets further)
        number = 0
        gave_up = False
        try:
            while not self._stop.is_set():
                number += 1
                changes = "" if previous is None else describe_changes(*previous, args, port)
                previous = (args, port)
                attempt, crash = self._one_attempt(number, args, port, changes)
                # that server is gone: nobody may be handed its endpoint any more
                self._ready.clear()
                with self._lock:
                    self._endpoint = None
                if crash is None:  # stopped on request
                    break
                if attempt.ready_at is not None and (
                    (attempt.ended_at or time.time()) - attempt.ready_at >= self.policy.stable_after
                ):
                    failures = 0
                replanned = crash.recovery in _REPLANS
                if replanned:
                    replans += 1
                else:
                    failures += 1
                decision = self._decide(crash, args, port, failures, replans)
                with self._lock:
                    self._last_crash = crash
                if decision is None:
                    gave_up = True
                    break
                args, port, action = decision
                delay = self.policy.backoff(1 if replanned else failures)
                attempt.action = f"{action}; restarting in {delay:.1f} s"
                self._set_state(State.CRASHED, number, f"{crash.describe()}; {attempt.action}")
                if self._stop.wait(delay):
                    break
        except Exception as exc:  # report instead of dying silently
            log.exception("engine monitor failed")
            with self._lock:
                self._last_crash = CrashReport(
                    "exited", f"k3desk could not run llama-server: {exc}", "", "none"
                )
            self._set_state(State.CRASHED, number, str(exc), final=True)
            gave_up = True
        finally:
            self._ready.clear()
            with self._lock:
                self._endpoint = None
            if not gave_up:
                self._set_state(State.STOPPED, number)
            self._done.set()

    def _decide(
        self, crash: CrashReport, args: tuple[str, ...], port: int, failures: int, replans: int
    ) -> tuple[tuple[str, ...], int, str] | None:
        """Next (args, port, what changed), or None to give up (state CRASHED, final)."""
        number = len(self._history)
        give_up = ""
        new_args, new_port, action = args, port, "restarting unchanged"
        if crash.recovery == "none":
            give_up = "restarting cannot fix this"
        elif crash.recovery in _REPLANS and replans > self.policy.max_replans:
            give_up = f"{replans - 1} re-plans did not help"
        elif crash.recovery not in _REPLANS and failures >= self.policy.max_failures:
            give_up = f"{failures} failed attempts in a row"
        elif crash.recovery == "new_port":
            if self.spec.port is not None:
                give_up = f"port {port} was chosen explicitly"
            else:
                new_port = free_port()
                while new_port == port:
                    new_port = free_port()
                action = f"port {port} was taken, using {new_port}"
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
            self._set_state(
                State.CRASHED, number, f"{crash.describe()}. Gave up: {give_up}.", final=True
            )
            return None
        return new_args, new_port, action

    def _default_replan(
        self, crash: CrashReport, args: tuple[str, ...]
    ) -> tuple[tuple[str, ...], str] | None:
        if crash.recovery == "no_repack":
            if "--no-repack" in args or "-nr" in args:
                return None
            return (*args, "--no-repack"), "added --no-repack (AMX repack assertion)"
        if crash.recovery == "replan_cpu_moe":
            return bump_n_cpu_moe(args, self.spec.n_layers, self.policy.cpu_moe_step)
        return None

    def _one_attempt(
        self, number: int, args: tuple[str, ...], port: int, changes: str = ""
    ) -> tuple[Attempt, CrashReport | None]:
        log_path = self._new_log_file(number)
        key_file = self._write_key_file(log_path) if self.spec.api_key_file else None
        key_args = ("--api-key-file", str(key_file)) if key_file else ("--api-key", self.api_key)
        argv = (
            str(self.spec.executable),
            *args,
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            *key_args,
        )
        try:
            return self._launch(number, argv, port, log_path, key_file, changes)
        finally:
            if key_file is not None:
                key_file.unlink(missing_ok=True)

    def _write_key_file(self, log_path: Path) -> Path:
        path = self.paths.state / "run" / (log_path.stem + ".key")
        with open_private(path, "w") as f:
            f.write(self.api_key + "\n")
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
        attempt = Attempt(number, redact(argv, self.api_key), port, log_path, changes=changes)
        with self._lock:
            self._history.append(attempt)
            self._endpoint = None
        self._progress = LoadProgressParser()
        self._ready.clear()
        started = ""
        if number > 1:
            started = f"changed: {changes}" if changes else "the same command again"
        self._set_state(State.STARTING, number, started)
        problem, hint = port_problem(port)
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
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_make_preexec(os.getpid()),  # PR_SET_PDEATHSIG: see module doc
                    close_fds=True,
                )
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
            attempt.pid = proc.pid
            watchdog = _start_watchdog(proc.pid)
            with self._lock:
                self._proc = proc
            reader = threading.Thread(
                target=self._read_output,
                args=(proc, logf, number),
                name="llama-server-log",
                daemon=True,
            )
            reader.start()
            stopped_by_us = False
            timed_out = False
            try:
                stopped_by_us, timed_out = self._watch(proc, attempt, port, key_file)
            finally:
                if proc.poll() is None:
                    self._terminate(proc)
                proc.wait()
                reader.join(5.0)
                if watchdog is not None:
                    watchdog.kill()
                    watchdog.wait()
                with self._lock:
                    self._proc = None
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
                status = _health(port)
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
                    if self._progress.feed_bytes(bytes_loaded(proc.pid), self.spec.model_bytes):
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
        ours = _family(proc.pid)
        foreign = [pid for pid in _listeners(port) if pid not in ours]
        if foreign:
            who = _listener_names(port)
            return CrashReport(
                "port_in_use",
                f"Another program listens on port {port} as well ({who}): what answers "
                "there is not only the engine k3desk started",
                "Stop that program, or let k3desk choose the port (leave --port out).",
                "new_port",
            )
        if not _owns_listener(ours, port):
            return None
        status = _authorized_status(ours, port, self.api_key)
        if status == 200:
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
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(self.policy.stop_grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # anything else left in the group (the server spawns no helpers, but be sure)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def _read_output(self, proc: subprocess.Popen[bytes], logf: IO[bytes], number: int) -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        partial = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            logf.write(chunk.replace(self.api_key.encode(), b"***"))
            logf.flush()
            data = partial + chunk
            *lines, partial = data.split(b"\n")
            if partial and set(partial.strip()) <= {ord(".")} and partial.strip():
                # progress dots arrive without a newline
                if self._progress.feed_dots(len(partial.strip())):
                    self._loading_progress(number)
                partial = b""
            for raw in lines:
                self._handle_line(raw.decode("utf-8", "replace"), number)
        if partial:
            self._handle_line(partial.decode("utf-8", "replace"), number)
        proc.stdout.close()

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


def ownership_problem(pid: int, port: int, api_key: str) -> str:
    """Why the server on ``port`` is not provably process ``pid``'s ("" when it is).

    The same checks a launch makes before it hands out an endpoint (:meth:`Supervisor._verify`):
    nothing else listens on the port, ``pid`` (or a descendant) holds the listening
    socket, and the key is accepted on a connection ``pid`` is seen to hold (the key is
    never sent to anything else).
    """
    if not alive_pid(pid):
        return f"process {pid} is no longer running"
    ours = _family(pid)
    foreign = [p for p in _listeners(port) if p not in ours]
    if foreign:
        return f"another program listens on port {port} ({_listener_names(port)})"
    if not _owns_listener(ours, port):
        return f"process {pid} does not listen on port {port}"
    status = _authorized_status(ours, port, api_key)
    if status != 200:
        why = f"HTTP {status}" if status is not None else "no answer"
        return f"the server on port {port} did not accept the key ({why})"
    return ""


def alive_pid(pid: int) -> bool:
    """Whether ``pid`` is a running (not a zombie) process."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def bytes_loaded(pid: int) -> int:
    """How much of the model a loading server has touched: bytes it read from storage or
    its resident set, whichever is larger (pages already in the page cache are not read)."""
    try:
        p = psutil.Process(pid)
        rss = int(p.memory_info().rss)
        try:
            read = int(p.io_counters().read_bytes)
        except (psutil.AccessDenied, AttributeError):
            read = 0
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0
    return max(rss, read)


def _family(pid: int) -> set[int]:
    """``pid`` and its descendants (a wrapper script may start the real server)."""
    out = {pid}
    with contextlib.suppress(psutil.Error):
        out |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
    return out


def _connections(pids: set[int]) -> list[psutil._common.pconn]:
    conns: list[psutil._common.pconn] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            conns += psutil.Process(pid).net_connections("tcp")
    return conns


def _owns_listener(pids: set[int], port: int) -> bool:
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in _connections(pids))


def _authorized_status(pids: set[int], port: int, api_key: str) -> int | None:
    """HTTP status of an authenticated GET /v1/models on ``port``, sent only once one of
    ``pids`` is seen holding the other end of the connection (None otherwise).

    /v1/models is not among llama-server's public endpoints (/health, /v1/health:
    server-http.cpp in b11434), so a 200 means the key was accepted.
    """
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=2.0)
    try:
        conn.connect()
        assert conn.sock is not None
        mine = conn.sock.getsockname()[:2]
        deadline = time.monotonic() + 2.0
        while not any(c.raddr and (c.raddr.ip, c.raddr.port) == mine for c in _connections(pids)):
            if time.monotonic() > deadline:
                return None  # never seen accepted by our server: the key stays here
            time.sleep(0.002)
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {api_key}"})
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _health(port: int) -> int | None:
    """HTTP status of GET /health, or None if nothing answers yet."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=2.0)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


_CPU_MOE = ("--n-cpu-moe", "-ncmoe")


def bump_n_cpu_moe(
    args: Sequence[str], n_layers: int = 0, step: int = 0
) -> tuple[tuple[str, ...], str] | None:
    """Keep more expert layers in RAM: raise ``--n-cpu-moe`` by ``step`` (default about a
    tenth of the layers, at least 1; 4 when the layer count is unknown).  ``--n-cpu-moe N``
    covers layers 0..N-1, so N = ``n_layers`` puts every expert in RAM; None then."""
    out = list(args)
    if "--cpu-moe" in out or "-cmoe" in out:
        return None
    if step <= 0:
        step = max(1, math.ceil(n_layers / 10)) if n_layers else 4
    current, index = 0, -1
    for i, a in enumerate(out):
        if a in _CPU_MOE and i + 1 < len(out):
            current, index = int(out[i + 1]), i + 1
        elif a.startswith("--n-cpu-moe="):
            current, index = int(a.split("=", 1)[1]), i
            out[i] = "--n-cpu-moe"
            out.insert(i + 1, str(current))
            index = i + 1
    limit = n_layers or None
    if limit is not None and current >= limit:
        return None
    new = current + step if limit is None else min(limit, current + step)
    if index >= 0:
        out[index] = str(new)
    else:
        out += ["--n-cpu-moe", str(new)]
    return (
        tuple(out),
        f"re-planned after GPU out-of-memory: --n-cpu-moe {current} -> {new} "
        f"(expert weights of {new - current} more layer{'s' if new - current > 1 else ''} "
        "kept in RAM)",
    )


_NUMBER = re.compile(r"-\d")


def _options(args: Sequence[str]) -> dict[str, str | None]:
    """``-c 4096 -fa on --jinja`` -> {"-c": "4096", "-fa": "on", "--jinja": None}."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-") or _NUMBER.match(a):
            out[f"argument {i + 1}"] = a  # a stray positional
            i += 1
        elif a.startswith("--") and "=" in a:
            key, value = a.split("=", 1)
            out[key] = value
            i += 1
        elif i + 1 < len(args) and (
            not args[i + 1].startswith("-") or _NUMBER.match(args[i + 1]) is not None
        ):
            out[a] = args[i + 1]
            i += 2
        else:
            out[a] = None
            i += 1
    return out


def arg_changes(old: Sequence[str], new: Sequence[str]) -> list[str]:
    """How ``new`` llama-server arguments differ from ``old``, one item per option:
    ``["--n-cpu-moe 2 -> 4", "added --no-mmproj-offload"]``."""
    a, b = _options(old), _options(new)

    def said(key: str, value: str | None) -> str:
        return key if value is None else f"{key} {value}"

    out: list[str] = []
    for key, value in b.items():
        if key not in a:
            out.append(f"added {said(key, value)}")
        elif a[key] != value:
            out.append(f"{key} {a[key] or 'on'} -> {value or 'on'}")
    out += [f"removed {said(key, value)}" for key, value in a.items() if key not in b]
    return out


def describe_changes(
    old_args: Sequence[str], old_port: int, new_args: Sequence[str], new_port: int
) -> str:
    """What differs between two launches, in words ("" when nothing does)."""
    out = arg_changes(old_args, new_args)
    if new_port != old_port:
        out.append(f"port {old_port} -> {new_port}")
    return ", ".join(out)
