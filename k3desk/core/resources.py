"""Locate the ``resources/`` folder (catalog data, icons, desktop files)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def resources_dir() -> Path:
    override = os.environ.get("K3DESK_RESOURCES")
    if override:
        return Path(override)
    frozen = getattr(sys, "_MEIPASS", None)  # PyInstaller onedir bundle
    if frozen:
        return Path(frozen) / "resources"
    return Path(__file__).resolve().parents[2] / "resources"
