"""Child processes k3desk owns: started in their own session, never left behind.

Every program k3desk starts (llama-server, the ssh client that carries a cluster
rank, an engine build with its compilers, a download child, a ``--version`` check)
goes through :func:`spawn`, which returns a :class:`Child`.  (The cluster's node probe,
``cluster/node_probe.py``, is sent to another machine as text and runs there on the
standard library alone.)

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
  (``--version``, ``git rev-parse``): it waits, collects, and past its time limit
  stops the whole group, not only the leader as ``subprocess.run`` would;
* :func:`pump` reads a child's output as lines (and, for a caller that wants
  them, the raw chunks and an unterminated last line, e.g. llama-server's
  progress dots), on the calling thread or on a thread of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

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
        self.signal_group(signal.SIGKILL)
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
) -> Child:
    """Start ``argv`` as a child k3desk owns (see the module doc).

    ``die_with_parent``: the kernel kills the child when the calling thread ends
    (Linux); leave it off only for a child that must outlive the thread starting it.
    ``guard_group``: a watchdog ends the child's whole group if k3desk dies (for
    children that start children of their own: builds); implied where PDEATHSIG
    does not exist and ``die_with_parent`` was asked for.  Raises ``OSError`` when
    the program cannot be started.
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
    )
    watchdog = None
    if guard_group or (die_with_parent and preexec is None):
        try:
            watchdog = _start_watchdog(popen.pid, guard_grace)
        except OSError:
            log.exception("could not start the watchdog of pid %d", popen.pid)
    return Child(popen, watchdog)


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    merge_stderr: bool = False,
    grace: float = 2.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end as a :func:`spawn`ed child (stdin from /dev/null) and
    collect its output, decoded as UTF-8 with undecodable bytes replaced; with
    ``merge_stderr`` the error stream is interleaved into ``stdout``.

    Past ``timeout`` seconds the child's whole group is stopped (SIGTERM, ``grace``,
    SIGKILL) and ``subprocess.TimeoutExpired`` raised with what it printed so far.
    Raises ``OSError`` when the program cannot be started.  The calling thread waits,
    so the child dies with it (PDEATHSIG) as with any :func:`spawn`."""
    child = spawn(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    args = [os.fspath(a) for a in argv]
    try:
        out, err = child.popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.stop(grace)
        try:  # the rest of what it printed (a process that left the group may hold the pipe)
            out, err = child.popen.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            out = err = None
        raise subprocess.TimeoutExpired(
            args, timeout, output=_text(out), stderr=_text(err)
        ) from None
    except BaseException:  # Ctrl-C while waiting: the child goes too
        child.stop(grace)
        raise
    finally:
        child.close_pipes()
    child.finish()
    return subprocess.CompletedProcess(args, child.popen.returncode, _text(out), _text(err))


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
