"""The machine as the shells show it: its profile, its disks, the memory bandwidth it
measured, the environment a launch on its GPUs gets, and what the tiers' verdicts mean."""

from __future__ import annotations

from pathlib import Path

from k3desk.core.hardware import detect as _detect
from k3desk.core.hardware.bandwidth import fmt_bandwidth
from k3desk.core.hardware.detect import disk_warnings
from k3desk.core.hardware.disk_rate import fmt_read_rate
from k3desk.core.hardware.nvidia import launch_env
from k3desk.core.hardware.profile import DiskInfo, HardwareProfile
from k3desk.core.planning.recommend import FITS, Recommendation

__all__ = [
    "FITS",
    "DiskInfo",
    "HardwareProfile",
    "Recommendation",
    "detect_disk",
    "disk_warnings",
    "fmt_bandwidth",
    "fmt_read_rate",
    "launch_env",
]


def detect_disk(path: Path) -> DiskInfo:
    """The disk that holds ``path``: its free space, its kind and its speed class (see
    :func:`k3desk.core.hardware.detect.detect_disk`, looked up at each call)."""
    return _detect.detect_disk(path)
