"""Use-case "one k3desk per person": the first desktop app of a person (of one k3desk
home) holds a lock in the private runtime folder (``state/run``, 0700) for as long as it
runs, and listens on a local socket beside it; a second start (the launcher, ``k3desk``
with no command, the tray) finds the lock held and asks the running one to bring its
window forward, instead of opening a second app that would supervise the same engine.

The lock is an advisory ``flock`` on ``app.lock``: the kernel lets go of it when its
process ends, however it ends, so a lock left by a ``kill -9`` is never mistaken for a
running app, and the next start takes it (and the socket left beside it) over.  The
socket itself is the shell's (Qt's ``QLocalServer`` in the desktop app); this module
names it, holds the lock, and says which process holds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.private import open_regular, private_dir

if TYPE_CHECKING:
    from k3desk.core.paths import AppPaths

LOCK = "app.lock"
SOCKET = "app.sock"
# AF_UNIX paths hold 108 bytes on Linux (104 on macOS): a longer one goes elsewhere
SOCKET_PATH_MAX = 100


def run_dir(paths: AppPaths) -> Path:
    return paths.state / "run"


def socket_name(paths: AppPaths) -> str:
    """The local socket the running app listens on: ``state/run/app.sock``, or, where
    that path is too long for a socket, one named after it in a private folder of this
    user under the temporary folder (``k3desk-<uid>``, 0700)."""
    path = run_dir(paths) / SOCKET
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
        return str(path)
    folder = Path(tempfile.gettempdir()) / f"k3desk-{os.getuid()}"
    private_dir(folder)
    st = folder.lstat()
    if st.st_uid != os.getuid() or folder.is_symlink():
        raise OSError(errno.EPERM, "not this user's folder", str(folder))
    key = hashlib.sha256(os.fsencode(paths.state.resolve())).hexdigest()[:16]
    return str(folder / f"app-{key}.sock")


@dataclass
class InstanceLock:
    """This process is the one k3desk app of this home while it holds the lock."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # closing the descriptor lets go of the flock
            self.fd = -1


def claim(paths: AppPaths) -> InstanceLock | None:
    """The lock, now held by this process; None while another live process holds it.

    Raises OSError when the runtime folder or the lock file cannot be made."""
    folder = private_dir(run_dir(paths))
    path = folder / LOCK
    fd = open_regular(path, os.O_RDWR | os.O_CREAT)  # 0600, no link followed
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return InstanceLock(path, fd)


def holder(paths: AppPaths) -> int | None:
    """The process id the lock file names (the running app's; None when unreadable)."""
    try:
        text = (run_dir(paths) / LOCK).read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    first = text.strip().split("\n", 1)[0]
    return int(first) if first.isdigit() else None
