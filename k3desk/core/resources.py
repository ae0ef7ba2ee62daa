"""Locate the resources folder (catalog data, icons, desktop files).

The repository keeps it at the top level (``resources/``); a wheel ships it inside the
package as ``k3desk/resources`` (mapped in setup.py), found with
:mod:`importlib.resources`; a source checkout (or an editable install of it) uses the
top-level folder.  A PyInstaller bundle carries it beside the code
(``packaging/k3desk.spec``).
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path


def resources_dir() -> Path:
    override = os.environ.get("K3DESK_RESOURCES")
    if override:
        return Path(override)
    frozen = getattr(sys, "_MEIPASS", None)  # PyInstaller onedir bundle
    if frozen:
        return Path(frozen) / "resources"
    # an installed wheel: k3desk/resources, a real folder beside the code
    shipped = resources.files("k3desk") / "resources"
    if isinstance(shipped, Path) and (shipped / "catalog.json").is_file():
        return shipped
    # a source checkout (editable install, or run in place): the top-level folder
    return Path(__file__).resolve().parents[2] / "resources"
