"""The core must run without Qt: every core module imports with PySide6 made unimportable."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import k3desk.core

REPO = Path(__file__).resolve().parents[1]


def test_every_core_module_imports_without_qt() -> None:
    modules = sorted(
        m.name for m in pkgutil.walk_packages(k3desk.core.__path__, prefix="k3desk.core.")
    )
    assert len(modules) > 5
    code = (
        "import sys, importlib\n"
        "sys.modules['PySide6'] = None\n"
        "sys.modules['shiboken6'] = None\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "assert not any(k.startswith('PySide6.') for k in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_no_qt_import_statement_under_core() -> None:
    offenders = []
    for path in (REPO / "k3desk" / "core").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "PySide6" in text.replace("never import PySide6", "").replace("PySide6/Qt", ""):
            for line in text.splitlines():
                stripped = line.strip()
                if stripped.startswith(("import PySide6", "from PySide6")):
                    offenders.append(f"{path}: {stripped}")
    assert offenders == []
