"""A pytest plugin that makes Qt unimportable, for running the core tests.

``python -m pytest -p tests.noqt -p no:pytest-qt tests/core`` proves that k3desk.core
works on a machine without PySide6: any import of it fails as if it were not
installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

BLOCKED = ("PySide6", "shiboken6", "pytestqt")


class _BlockQt(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked for core tests)")
        return None


for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        raise RuntimeError(f"{name} was imported before the Qt blocker could be installed")
sys.meta_path.insert(0, _BlockQt())
