"""Private by default: k3desk's own folders are 0700 and its files 0600.

Conversations, engine logs (prompts can appear in them), API key files,
settings and the cluster and server lists are nobody else's business on a
shared machine.  Everything k3desk writes for itself goes through here:

* :func:`private_dir` makes a folder (and the missing ones above it inside the
  same tree) 0700, and tightens an existing folder of ours that is looser;
* :func:`private_file` makes an empty file, or tightens an existing one, 0600
  (:func:`make_private` only tightens what exists);
* :func:`write_private` replaces a file's content atomically, the new file
  created 0600 from the start (never briefly readable by others);
* :func:`open_private` opens a file for writing or appending, created 0600.

What is opened in place (not replaced) must be a regular file: a named pipe or a
device there is refused with an OSError, never waited on.

A folder or file owned by someone else is left as it is (k3desk cannot and
should not change it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from pathlib import Path
from typing import IO, Literal, overload

DIR_MODE = 0o700
FILE_MODE = 0o600


def _tighten(path: Path, mode: int) -> None:
    with contextlib.suppress(OSError):
        st = os.stat(path)
        if st.st_uid == os.getuid() and st.st_mode & 0o777 & ~mode:
            os.chmod(path, st.st_mode & 0o777 & mode)


def private_dir(path: Path) -> Path:
    """Create ``path`` (with its missing parents) as 0700; tighten it if it exists.

    Raises what :func:`os.mkdir` raises (the callers word it for their context).
    """
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, DIR_MODE)
        _tighten(d, DIR_MODE)  # mkdir's mode is filtered by the umask: be sure
    _tighten(path, DIR_MODE)
    return path


def make_private(path: Path) -> None:
    """Tighten an existing file (0600) or folder (0700) of ours; nothing if it is missing."""
    _tighten(path, DIR_MODE if path.is_dir() else FILE_MODE)


def _open_regular(path: Path, flags: int) -> int:
    """``os.open`` that never waits and gives only a regular file: a named pipe without
    a reader would block a plain open for writing for ever (``O_NONBLOCK`` makes it fail
    with ENXIO instead), and a pipe with a reader, a device or a socket is refused."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0), FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OSError(
                errno.ENXIO, "it is a named pipe or socket, not a file", str(path)
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "it is not a regular file (a pipe or a device)", str(path))
    os.set_blocking(fd, True)
    return fd


def private_file(path: Path) -> Path:
    """Create ``path`` empty as 0600 if it does not exist; tighten it if it does.

    Raises OSError when it exists and is not a regular file (never waits on a pipe)."""
    private_dir(path.parent)
    fd = _open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC)
    os.close(fd)
    _tighten(path, FILE_MODE)
    return path


@overload
def open_private(path: Path, mode: Literal["w", "a"] = "w") -> IO[str]: ...
@overload
def open_private(path: Path, mode: Literal["wb", "ab"]) -> IO[bytes]: ...
def open_private(path: Path, mode: str = "w") -> IO[str] | IO[bytes]:
    """Open ``path`` for writing (``w``/``wb``) or appending (``a``/``ab``), created 0600."""
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
    flags |= os.O_APPEND if mode.startswith("a") else os.O_TRUNC
    fd = _open_regular(path, flags)
    _tighten(path, FILE_MODE)
    if "b" in mode:
        return os.fdopen(fd, mode)
    return os.fdopen(fd, mode, encoding="utf-8", errors="replace")


def write_private(path: Path, data: str | bytes, *, fsync: bool = False) -> None:
    """Replace ``path``'s content with ``data`` atomically; the file is 0600.

    The new content goes to a temporary file beside it first (created 0600),
    which is then renamed over ``path``: a crash or a full disk leaves the old
    file intact.  The temporary file is removed when writing fails.
    """
    private_dir(path.parent)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            view = memoryview(raw)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
