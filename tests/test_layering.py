"""The core must run without Qt: every core module imports with PySide6 made unimportable."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
import tomllib
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


def test_the_shells_contract_forbids_every_core_package_but_the_application_layer() -> None:
    """``k3desk.ui`` and ``k3desk.cli`` reach the core only through ``k3desk.core.app``:
    the import-linter contract names every other package and module of the core (a new
    one is forbidden the day it is added), with no exemption."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    shells = [
        c for c in contracts if set(c.get("source_modules", ())) == {"k3desk.ui", "k3desk.cli"}
    ]
    assert len(shells) == 1
    (contract,) = shells
    assert contract["type"] == "forbidden"
    assert "ignore_imports" not in contract
    core_children = {
        m.name for m in pkgutil.iter_modules(k3desk.core.__path__, prefix="k3desk.core.")
    }
    assert "k3desk.core.app" in core_children
    assert sorted(contract["forbidden_modules"]) == sorted(core_children - {"k3desk.core.app"})


def test_no_shell_module_names_a_core_module_outside_the_application_layer() -> None:
    """The same rule read from the source, lazy and type-only imports included."""
    offenders = []
    for shell in ("ui", "cli"):
        for path in (REPO / "k3desk" / shell).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else []
                )
                for name in names:
                    if name.startswith("k3desk.core.") and not name.startswith("k3desk.core.app"):
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
    assert offenders == []
