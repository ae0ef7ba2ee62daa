"""Helpers for tests that watch real processes end."""

from __future__ import annotations

import time

import psutil


def gone_within(pid: int, seconds: float) -> bool:
    """True once ``pid`` no longer runs (a zombie nobody reaped yet counts as gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
