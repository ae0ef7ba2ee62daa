"""The desktop's menus: what k3desk asks of the desktop's own tools after it adds or
removes its entry (``k3desk desktop-entry``)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

from k3desk.core.process import run

__all__ = ["refresh_desktop_caches"]


def refresh_desktop_caches(apps: Path, icons: Path) -> None:
    """Tell the desktop about a new entry: its desktop-file and icon caches rebuilt (best
    effort: the tools may be absent, and a failure changes nothing of k3desk's).  They run
    as every child of k3desk does (:mod:`k3desk.core.process`: own session, bounded
    output, ended with k3desk); the caches they write are for the desktop to read, not
    for others to change (umask 022)."""
    for argv in (
        ["update-desktop-database", "-q", str(apps)],
        ["gtk-update-icon-cache", "-q", "-t", str(icons)],
    ):
        if shutil.which(argv[0]):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                run(argv, timeout=30, umask=0o022)
