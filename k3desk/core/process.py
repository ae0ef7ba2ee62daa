"""Child processes k3desk owns: started in their own session, never left behind.

Every program k3desk starts (llama-server, the ssh client that carries a cluster
rank, an engine build with its compilers, a download child, a ``--version`` check)
goes through :func:`spawn`, which returns a :class:`Child`.  (The cluster's node probe,
``cluster/node_probe.py``, is sent to another machine as text and runs there on the
standard library alone; its own ``_run`` gives the programs it starts there what
:func:`run` gives them here: a session of their own, the group ended, output bounded.)

* the child leads a new session, so it has a process group of its own: stopping
  signals the whole group, the compilers a build started included, and a Ctrl-C
  in the terminal reaches k3desk alone, which then stops its children in order;
* on Linux the child asks the kernel, between fork and exec, to SIGKILL it when
  its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, prctl(2)).  The kernel's
  notion of "parent" is the *thread* that forked, so spawn from a thread that
  lives as long as the child should (a monitor thread, or the thread that waits
  for the child).  The child also checks that its parent did not die before the
  prctl took effect;
* PDEATHSIG reaches the direct child only, and does not exist outside Linux.  With
  ``guard_group`` (or where prctl is missing) a small watchdog process holds the
  read end of a pipe only k3desk writes to; when k3desk dies, however it dies, the
  kernel closes that pipe and the watchdog ends the child's whole group (SIGTERM,
  a grace period, SIGKILL);
* :meth:`Child.stop` is SIGTERM to the group, a grace period, then SIGKILL, and a
  last SIGKILL for anything the leader left in its group;
* :func:`run` is :func:`spawn` for a short command whose output is all k3desk wants
  (``--version``, ``git rev-parse``): it waits, keeps at most :data:`OUTPUT_LIMIT`
  bytes of each stream (the rest is read and discarded, and counted: a program that
  prints a gigabyte costs k3desk no memory), and past its time limit stops the whole
  group, not only the leader as ``subprocess.run`` would;
* when a leader has ended, :meth:`Child.finish` ends whatever it left behind: its
  process group, every other process of its session (a job a shell put in a group of
  its own), and for :func:`run` every process still holding its output pipe (a daemon
  that left the session with ``setsid`` but kept the descriptors it inherited); the
  processes it ended are in ``left_running``, so a caller can say so.  A daemon that
  left the session *and* closed every inherited descriptor cannot be told from any
  other program of the same person, and is not looked for;
* :func:`pump` reads a child's output as lines (and, for a caller that wants
  them, the raw chunks and an unterminated last line, e.g. llama-server's
  progress dots), on the calling thread or on a thread of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import psutil

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()


def has_pdeathsig() -> bool:
    """Whether children can be tied to the thread that started them (Linux)."""
    return _PRCTL is not None


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A preexec_fn: the kernel SIGKILLs the child when the thread that forked it ends."""
    prctl = _PRCTL
    if prctl is None:
        return None

    def setup() -> None:  # runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return setup


# The watchdog: block until the pipe from k3desk closes (k3desk ended: the kernel
# closes a dead process's descriptors), then end the child's group.  A stopped
# child's watchdog is killed before it reads EOF, so it never signals a group
# number the system may have handed out again.
_WATCHDOG = r"""
import os, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
try:
    while sys.stdin.buffer.read(4096):
        pass
except OSError:
    pass
for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        sys.exit(0)
    end = time.monotonic() + wait
    while time.monotonic() < end:
        time.sleep(0.05)
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            sys.exit(0)
"""


def _start_watchdog(pgid: int, grace: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(pgid), str(grace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


class Child:
    """A running child process and its process group (see the module doc)."""

    def __init__(
        self, popen: subprocess.Popen[Any], watchdog: subprocess.Popen[bytes] | None
    ) -> None:
        self.popen = popen
        self._watchdog = watchdog
        self._lock = threading.Lock()
        self._reaped_group = False
        # processes the leader left running when it ended, which finish() ended
        self.left_running: tuple[int, ...] = ()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    @property
    def stdin(self) -> IO[Any] | None:
        return self.popen.stdin

    @property
    def stdout(self) -> IO[Any] | None:
        return self.popen.stdout

    @property
    def stderr(self) -> IO[Any] | None:
        return self.popen.stderr

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; raises ``subprocess.TimeoutExpired`` past ``timeout``."""
        return self.popen.wait(timeout)

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the child's whole group; False if the group is gone."""
        with self._lock:
            if self._reaped_group:
                return False
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the whole group at once (the leader too, even if it left the group)."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, OSError):
            self.popen.kill()

    def stop(self, grace: float) -> int:
        """SIGTERM to the group, up to ``grace`` seconds, then SIGKILL; the exit status.

        Idempotent; also ends whatever the leader left running in its group, and
        releases the watchdog."""
        if self.popen.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
        rc = self.popen.wait()
        self.finish()
        return rc

    def finish(self) -> None:
        """After the leader ended: SIGKILL anything left in its group, release the watchdog.

        Call once the leader's exit was seen (``wait``); stop() calls it itself."""
        if self.popen.poll() is None:
            return
        with self._lock:
            if self._reaped_group:
                return
        self.left_running = end_session(self.popen.pid)
        with self._lock:
            self._reaped_group = True
            watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            with contextlib.suppress(OSError):
                watchdog.kill()
            watchdog.wait()
            if watchdog.stdin is not None:
                with contextlib.suppress(OSError):
                    watchdog.stdin.close()

    def close_pipes(self) -> None:
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(5.0)
        self.close_pipes()


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def session_members(sid: int) -> list[int]:
    """The live processes of session ``sid`` (a :func:`spawn`ed child's pid: it leads
    its own session and group), other than this one.  While any of them lives the
    kernel keeps the number ``sid`` from being handed to a new process."""
    me = os.getpid()
    out = []
    for pid in psutil.pids():
        if pid == me:
            continue
        try:
            if os.getsid(pid) != sid:
                continue
        except OSError:  # gone meanwhile
            continue
        if _alive(pid):
            out.append(pid)
    return out


def end_session(sid: int) -> tuple[int, ...]:
    """SIGKILL the group and every other process of session ``sid`` once its leader has
    ended and been reaped; the processes that were still running (and were ended)."""
    ended: set[int] = set()
    for _ in range(3):  # one may fork while the last is ended
        members = session_members(sid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, signal.SIGKILL)
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        ended.update(members)
        if not members:
            break
    if ended:
        log.info("process %d left %d processes running; ended them", sid, len(ended))
    return tuple(sorted(ended))


def pipe_holders(inodes: set[int]) -> list[int]:
    """Processes other than this one that hold a pipe of one of ``inodes`` (Linux: read
    from /proc/PID/fd; elsewhere none is found)."""
    if not inodes or not os.path.isdir("/proc/self/fd"):
        return []
    wanted = {f"pipe:[{ino}]" for ino in inodes}
    me = os.getpid()
    out = []
    for pid in psutil.pids():
        if pid == me:
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:  # gone, or another person's
            continue
        for name in names:
            try:
                if os.readlink(f"{fd_dir}/{name}") in wanted:
                    out.append(pid)
                    break
            except OSError:
                continue
    return out


def spawn(
    argv: Sequence[str | os.PathLike[str]],
    *,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = subprocess.PIPE,
    stderr: int | IO[Any] | None = subprocess.STDOUT,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    text: bool = False,
    bufsize: int = -1,
    die_with_parent: bool = True,
    guard_group: bool = False,
    guard_grace: float = 5.0,
    umask: int = -1,
) -> Child:
    """Start ``argv`` as a child k3desk owns (see the module doc).

    ``die_with_parent``: the kernel kills the child when the calling thread ends
    (Linux); leave it off only for a child that must outlive the thread starting it.
    ``guard_group``: a watchdog ends the child's whole group if k3desk dies (for
    children that start children of their own: builds); implied where PDEATHSIG
    does not exist and ``die_with_parent`` was asked for.  ``umask``: the child's file
    creation mask (-1: k3desk's own).  Raises ``OSError`` when the program cannot be
    started.
    """
    preexec = _die_with_parent(os.getpid()) if die_with_parent else None
    popen: subprocess.Popen[Any] = subprocess.Popen(
        [os.fspath(a) for a in argv],
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=None if env is None else dict(env),
        cwd=cwd,
        text=text,
        bufsize=bufsize,
        start_new_session=True,
        preexec_fn=preexec,
        close_fds=True,
        umask=umask,
    )
    watchdog = None
    if guard_group or (die_with_parent and preexec is None):
        try:
            watchdog = _start_watchdog(popen.pid, guard_grace)
        except OSError:
            log.exception("could not start the watchdog of pid %d", popen.pid)
    return Child(popen, watchdog)


# What a run keeps of each stream it collects: a --version, --help or git query prints
# kilobytes; the rest of a flood is read and discarded (and counted), never held.
OUTPUT_LIMIT = 1 << 20
# After the leader ended, how long its output may take to close (its group finishing)
# before whatever still holds the pipe is looked for.
_LINGER = 0.25


class Ran(subprocess.CompletedProcess[str]):
    """A :func:`run` to its end: the exit status, what it printed (at most ``limit``
    bytes of each stream, decoded), and what became of the rest: ``discarded`` bytes
    printed past the limit, ``cut_off`` when it was ended for printing too much, and
    ``left_running``, the processes it left behind that k3desk ended."""

    def __init__(
        self,
        args: list[str],
        returncode: int,
        stdout: str,
        stderr: str,
        *,
        discarded: int = 0,
        cut_off: bool = False,
        left_running: tuple[int, ...] = (),
    ) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.discarded = discarded
        self.cut_off = cut_off
        self.left_running = left_running


class _Output:
    """A child's output pipes, read as they fill, at most ``limit`` bytes kept each."""

    def __init__(self, child: Child, limit: int) -> None:
        self.limit = limit
        self.kept: dict[int, bytearray] = {}
        self.discarded = 0
        self.inodes: set[int] = set()
        self.sel = selectors.DefaultSelector()
        self.fds: list[int | None] = []  # stdout's, stderr's
        for stream in (child.popen.stdout, child.popen.stderr):
            fd = None if stream is None else stream.fileno()
            self.fds.append(fd)
            if fd is not None:
                self.kept[fd] = bytearray()
                self.inodes.add(os.fstat(fd).st_ino)
                self.sel.register(fd, selectors.EVENT_READ)

    @property
    def open(self) -> bool:
        return bool(self.sel.get_map())

    @property
    def over(self) -> bool:
        return self.discarded > 0

    def read(self, wait: float) -> None:
        """Take what is there within ``wait`` seconds (an ended stream is unregistered)."""
        for key, _ in self.sel.select(max(0.0, wait)):
            fd = int(key.fd)
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                self.sel.unregister(fd)
                continue
            buf = self.kept[fd]
            room = self.limit - len(buf)
            buf += chunk[: max(0, room)]
            self.discarded += max(0, len(chunk) - max(0, room))

    def drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.open and time.monotonic() < end:
            self.read(end - time.monotonic())

    def text(self, which: int) -> str:
        """What stdout (0) or stderr (1) printed, as kept."""
        fd = self.fds[which]
        return "" if fd is None else _text(bytes(self.kept[fd]))

    def close(self) -> None:
        self.sel.close()


def _collect(child: Child, out: _Output, timeout: float, end_past_limit: bool) -> str:
    """Read ``child``'s output until it ends; "" when it ended (its pipes closed, or
    its leader ended and nothing of its group held them within a moment), "timeout",
    or "cut" (it printed more than the limit and ``end_past_limit``)."""
    deadline = time.monotonic() + timeout
    ended_at: float | None = None
    while out.open:
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        if end_past_limit and out.over:
            return "cut"
        if ended_at is None and child.popen.poll() is not None:
            ended_at = now
        if ended_at is not None and now - ended_at > _LINGER:
            return ""  # something that is not the leader holds the pipes: ended below
        out.read(min(deadline - now, 0.1))
    try:  # its output ended; the leader may still be on its way out
        child.popen.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return "timeout"
    return ""


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    merge_stderr: bool = False,
    grace: float = 2.0,
    limit: int = OUTPUT_LIMIT,
    end_past_limit: bool = False,
    umask: int = -1,
) -> Ran:
    """Run ``argv`` to its end as a :func:`spawn`ed child (stdin from /dev/null) and
    collect its output, decoded as UTF-8 with undecodable bytes replaced; with
    ``merge_stderr`` the error stream is interleaved into ``stdout``; ``umask`` as for
    :func:`spawn`.

    At most ``limit`` bytes of each stream are kept; the rest is read and discarded
    (``Ran.discarded``), or with ``end_past_limit`` the child is ended once it passes
    the limit (``Ran.cut_off``).  When the leader ends, what it left running is ended
    (``Ran.left_running``, see the module doc).  Past ``timeout`` seconds the child's
    whole group is stopped (SIGTERM, ``grace``, SIGKILL) and ``subprocess.TimeoutExpired``
    raised with what it printed so far.  Raises ``OSError`` when the program cannot be
    started.  The calling thread waits, so the child dies with it (PDEATHSIG) as with
    any :func:`spawn`."""
    child = spawn(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        env=env,
        cwd=cwd,
        umask=umask,
    )
    args = [os.fspath(a) for a in argv]
    out = _Output(child, limit)
    try:
        how = _collect(child, out, timeout, end_past_limit)
        child.stop(grace)  # the leader has ended, unless timed out or cut off
        out.drain(_LINGER)
        left = set(child.left_running)
        if out.open:  # a process that left the session still holds the output
            for pid in pipe_holders(out.inodes):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                left.add(pid)
            out.drain(grace)
    except BaseException:  # Ctrl-C while waiting: the child goes too
        child.stop(grace)
        raise
    finally:
        out.close()
        child.close_pipes()
    stdout, stderr = out.text(0), out.text(1)
    if how == "timeout":
        raise subprocess.TimeoutExpired(args, timeout, output=stdout, stderr=stderr)
    return Ran(
        args,
        child.popen.returncode,
        stdout,
        stderr,
        discarded=out.discarded,
        cut_off=how == "cut",
        left_running=tuple(sorted(left)),
    )


def _text(data: bytes | None) -> str:
    return data.decode("utf-8", "replace") if data else ""


def pump(
    stream: IO[bytes],
    on_line: Callable[[str], None],
    *,
    on_chunk: Callable[[bytes], None] | None = None,
    on_partial: Callable[[bytes], bool] | None = None,
) -> None:
    """Read ``stream`` to its end, calling ``on_line`` with each decoded line (no newline,
    no trailing CR).  ``on_chunk`` sees every raw chunk as read; ``on_partial`` sees an
    unterminated tail after each chunk and returns True when it consumed it.  Closes
    ``stream`` at the end."""
    fd = stream.fileno()
    partial = b""
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            if on_chunk is not None:
                on_chunk(chunk)
            *lines, partial = (partial + chunk).split(b"\n")
            if partial and on_partial is not None and on_partial(partial):
                partial = b""
            for raw in lines:
                on_line(raw.decode("utf-8", "replace").rstrip("\r"))
        if partial:
            on_line(partial.decode("utf-8", "replace").rstrip("\r"))
    finally:
        with contextlib.suppress(OSError):
            stream.close()


def pump_thread(
    stream: IO[bytes],
    on_line: Callable[[str], None],
    *,
    name: str,
    on_chunk: Callable[[bytes], None] | None = None,
    on_partial: Callable[[bytes], bool] | None = None,
) -> threading.Thread:
    """:func:`pump` on a daemon thread of its own (started); join it after the child ends."""
    thread = threading.Thread(
        target=pump,
        args=(stream, on_line),
        kwargs={"on_chunk": on_chunk, "on_partial": on_partial},
        name=name,
        daemon=True,
    )
    thread.start()
    return thread
