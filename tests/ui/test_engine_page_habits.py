"""The Engine page says what is so: the projector beside the chosen shard is filled in,
a probe that found an engine shows in every panel, "stopped" is said once, a relaunch
keeps the earlier attempts, and speeds read as numbers."""

from __future__ import annotations

import pytest

from k3desk.ui.engine.page import EnginePage, EnginePanel

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_the_projector_beside_the_chosen_shard_is_filled_in(
    ctx, qtbot, tiny_k3, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtWidgets import QFileDialog

    panel = EnginePanel(ctx)
    qtbot.addWidget(panel)
    monkeypatch.setattr(
        QFileDialog, "getOpenFileName", lambda *_a: (str(tiny_k3.first_part), "")
    )
    panel._browse_shard()
    assert panel.shard.text() == str(tiny_k3.first_part)
    assert panel.mmproj.text() == str(tiny_k3.mmproj)
    # a projector named by hand stays
    panel.mmproj.setText("/elsewhere/mine.gguf")
    panel._browse_shard()
    assert panel.mmproj.text() == "/elsewhere/mine.gguf"


def test_a_probe_shows_in_every_panel_and_relaunch_keeps_the_attempts(
    ctx, qtbot, llama_server, tiny_k3_single
) -> None:  # type: ignore[no-untyped-def]
    ctx.update_settings(engine_binary=str(llama_server), ctx=1024)
    page = EnginePage(ctx)
    other = EnginePanel(ctx, compact=True)  # the wizard's, built before any probe
    for w in (page, other):
        qtbot.addWidget(w)
    page.show()
    other.engines_note.setText("No llama-server found: build one.")
    page.activated()
    qtbot.waitUntil(lambda: bool(page.panel.rows), timeout=120_000)
    assert other.rows  # the other panel shows the same probe
    assert "No llama-server found" not in other.engines_note.text()
    page.panel.shard.setText(str(tiny_k3_single.first_part))
    page.panel.launch_btn.click()
    engine = ctx.engine
    qtbot.waitUntil(lambda: engine.ready, timeout=120_000)
    page.panel.stop_btn.click()
    qtbot.waitUntil(lambda: engine.state_name() == "stopped", timeout=60_000)
    assert page.panel.state.text() == "Engine: stopped."  # not "Engine: stopped. Stopped."
    assert page.attempts.rowCount() == 1
    page.panel.restart_btn.click()
    qtbot.waitUntil(lambda: engine.ready, timeout=120_000)
    qtbot.waitUntil(lambda: page.attempts.rowCount() == 2, timeout=10_000)
    assert page.attempts.item(0, 5).text() == "stopped on request"  # the earlier one stays
    page.panel.stop_btn.click()
    qtbot.waitUntil(lambda: engine.state_name() == "stopped", timeout=60_000)
