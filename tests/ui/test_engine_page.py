"""The Engine page launches the tiny Kimi-K3 through probe, validation, planning and the
supervisor, and shows its state, plan, memory, log, attempts and API."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
from PySide6.QtWidgets import QApplication

from k3desk.core.progress import CancelToken
from k3desk.ui.engine.controller import prepare_engine_request
from k3desk.ui.engine.page import EnginePage

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_launch_plan_log_attempts_api_and_restart_after_a_crash(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, tiny_k3, hardware_file
) -> None:
    ctx.update_settings(engine_binary=str(llama_server), ctx=2048)
    ctx.hardware.load_file(hardware_file("no-gpu-laptop-32GB"))
    qtbot.waitUntil(lambda: ctx.hardware.profile is not None, timeout=30_000)
    page = EnginePage(ctx)
    qtbot.addWidget(page)
    page.resize(1280, 900)
    page.show()
    page.activated()
    qtbot.waitUntil(lambda: bool(page.panel.rows), timeout=120_000)
    assert page.panel.usable()
    page.panel.shard.setText(str(tiny_k3.first_part))
    page.panel.mmproj.setText(str(tiny_k3.mmproj))
    assert page.panel.launch_btn.isEnabled()
    page.panel.launch_btn.click()
    engine = ctx.engine
    qtbot.waitUntil(lambda: engine.ready, timeout=120_000)
    # state, API address and key
    assert "ready" in page.panel.state.text()
    ep, address = engine.endpoint(), engine.address()
    assert address is not None
    assert address != ep.url  # the local API's address, held by the app's front
    assert page.url.edit.text() == f"{address}/v1"
    assert page.key.edit.text() == ep.api_key
    page.key.copy.click()
    assert QApplication.clipboard().text() == ep.api_key
    # "Copy for…": the settings each tool takes, with this launch's address and key
    menu = page.copy_for.menu()
    assert page.copy_for.isEnabled()
    assert [a.text() for a in menu.actions()] == [
        "curl",
        "OpenAI SDK (Python)",
        "Anthropic SDK (Python)",
    ]
    for action, base in zip(
        menu.actions(), (f"{address}/v1/", f'{address}/v1"', f'{address}"'), strict=True
    ):
        QApplication.clipboard().clear()
        action.trigger()  # read off the GUI thread (the person's keys are in the keyring)
        qtbot.waitUntil(lambda: bool(QApplication.clipboard().text()), timeout=10_000)
        assert base in QApplication.clipboard().text()
        assert ep.api_key in QApplication.clipboard().text()  # no key made: this launch's
    # the plan: one column per layer in the map, memory per device, argv with the shard
    req = engine.request
    assert req.plan is not None
    assert req.vision
    assert page.layer_map.plan is req.plan
    assert len(req.plan.layers) == 6
    assert page.memory.rowCount() == len(req.plan.devices)
    assert str(tiny_k3.first_part) in page.argv.edit.text()
    assert "--mmproj" in page.argv.edit.text()
    # the live log, filtered
    qtbot.waitUntil(lambda: "listening" in page.visible_log(), timeout=10_000)
    page.filter.setText("listening")
    assert all("listening" in ln.lower() for ln in page.visible_log().splitlines())
    page.filter.setText("")
    assert page.attempts.rowCount() == 1
    assert not page.panel.launch_btn.isEnabled()
    assert "already running" in page.panel.launch_btn.toolTip()
    # measured beside predicted: an answer's speeds (llama-server's own counters) reach
    # the page, and the next plan of this model says what was measured here
    assert page.speed_text.text().startswith("Predicted: about ")
    assert page.measured.text() == "Measured: after the first answer."
    r = httpx.post(
        f"{ep.url}/completion",
        headers=ep.headers,
        json={"prompt": list(range(1, 65)), "n_predict": 16, "ignore_eos": True},
        timeout=120,
    )
    r.raise_for_status()
    qtbot.waitUntil(lambda: page.measured.text().startswith("Measured: prompt"), timeout=30_000)
    assert "predicted" in page.measured.text()
    assert "decode" in page.measured.text()
    again = prepare_engine_request(ctx, tiny_k3.first_part, tiny_k3.mmproj, CancelToken())
    assert again.plan is not None
    assert again.plan.speed.calibration.startswith("measured here: ")
    # kill -9: the supervisor restarts it and the attempts table shows both
    os.kill(engine.supervisor.pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: page.attempts.rowCount() == 2 and engine.ready, timeout=120_000)
    first = page.attempts.item(0, 5).text()
    assert "SIGKILL" in first or "killed" in first.lower()
    # the restart ran the very same command, and the Changed column says so
    assert [page.attempts.item(i, 4).text() for i in range(2)] == ["—", "the same command again"]
    # stop
    page.panel.stop_btn.click()
    qtbot.waitUntil(lambda: engine.state_name() == "stopped", timeout=60_000)
    assert page.url.edit.text() == ""  # the stopped engine's address is not offered
    assert not page.url.copy.isEnabled()
    assert page.panel.launch_btn.isEnabled()


def test_a_missing_shard_is_refused_with_the_file_named(ctx, qtbot, tmp_path) -> None:  # type: ignore[no-untyped-def]
    page = EnginePage(ctx)
    qtbot.addWidget(page)
    missing = tmp_path / "Kimi-K3-IQ1_S-00001-of-00009.gguf"
    page.panel.shard.setText(str(missing))
    page.panel.launch_btn.click()
    qtbot.waitUntil(lambda: ctx.reporter.last is not None, timeout=30_000)
    message, hint, unexpected = ctx.reporter.last
    assert str(missing) in message
    assert hint
    assert not unexpected
    assert page.panel.launch_btn.isEnabled()


def test_the_tune_button_measures_variants_and_the_next_launch_uses_the_fastest(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, tiny_k3_single
) -> None:
    ctx.update_settings(engine_binary=str(llama_server), ctx=512)
    page = EnginePage(ctx)
    qtbot.addWidget(page)
    page.show()
    panel = page.panel
    assert not panel.tune_btn.isEnabled()  # no model chosen yet
    assert "first shard" in panel.tune_btn.toolTip()
    panel.shard.setText(str(tiny_k3_single.first_part))
    assert panel.tune_btn.isEnabled()
    panel.tune_btn.click()
    assert panel.tune_btn.text() == "Cancel tuning"
    assert not panel.launch_btn.isEnabled()  # the tuner's servers have the machine
    qtbot.waitUntil(lambda: panel.tune_btn.text() == "Tune speed", timeout=300_000)
    text = panel.tune_text.text()
    assert "Fastest: " in text, text
    assert "Over llama.cpp's own defaults" in text
    assert "Saved: the next launch of this model on this machine uses" in text
    assert panel.launch_btn.isEnabled()
    again = prepare_engine_request(ctx, tiny_k3_single.first_part, None, CancelToken())
    assert any("measured fastest on this machine" in n for n in again.notes)
