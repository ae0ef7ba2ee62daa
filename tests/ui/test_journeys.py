"""Journeys a newcomer walks, in a real window (offscreen), against the real llama-server.

1. "I have a GGUF already": add it on the Models page, Chat with it, send a message with
   an image, get an answer.
2. "Would it fit over there?": plan for another machine (a hardware file), come back to
   this one, and launch here: the launch plans for this machine.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QFileDialog

from k3desk.core.chat.model import ChatSettings
from k3desk.ui.pages import PageKey
from k3desk.ui.window import MainWindow

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# Random weights: a bounded, seeded answer keeps the journey short and repeatable.
SHORT = ChatSettings(thinking=False, max_tokens=16, seed=1, extra_body={"ignore_eos": True})


def open_window(ctx, qtbot) -> MainWindow:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    # a journey that fails half-way is closed by the teardown with its engine running:
    # nobody is there to answer the question closing asks, so the answer is given now
    w.close_choice = "stop"
    qtbot.addWidget(w)
    w.resize(1280, 800)
    w.show()
    return w


def settle(ctx, qtbot, w: MainWindow) -> None:  # type: ignore[no-untyped-def]
    """Let the pages' background work end, then close the window while the engine runs
    (what the person sees last; nothing is left talking to a server that is stopping)."""
    qtbot.waitUntil(lambda: ctx.tasks.active == 0, timeout=60_000)
    w.close_choice = "stop"  # closing asks about the running engine; the journey ends it
    w.close()
    qtbot.waitUntil(lambda: ctx.tasks.active == 0, timeout=60_000)


def own_copy(model, dest: Path) -> Path:  # type: ignore[no-untyped-def]
    """The newcomer's files: the set and its projector in a folder of their own."""
    dest.mkdir(parents=True)
    for p in (*model.parts, model.mmproj):
        shutil.copy2(p, dest / p.name)
    return dest / model.parts[0].name


def test_new_user_with_a_local_gguf_reaches_an_answer_with_an_image(  # type: ignore[no-untyped-def]
    ctx, qtbot, tiny_k3, tmp_path, monkeypatch
) -> None:
    assert ctx.first_run
    first = own_copy(tiny_k3, tmp_path / "Downloads" / "kimi")
    w = open_window(ctx, qtbot)
    w.show_page(PageKey.MODELS)
    mine = w.models_page().mine
    qtbot.waitUntil(lambda: mine.judgement is not None, timeout=120_000)
    # "Add a model…": the file dialog answers with the last part (any part will do)
    monkeypatch.setattr(
        QFileDialog, "getOpenFileName", lambda *a, **k: (str(first.parent / first.name), "")
    )
    mine.add_file.click()
    qtbot.waitUntil(lambda: len(mine.rows()) == 1, timeout=30_000)
    (row,) = mine.shown_rows()
    assert row["vision"] == "yes"
    assert "this machine" in mine.status.text()
    assert mine.chat_btn.isEnabled()
    qtbot.mouseClick(mine.chat_btn, Qt.MouseButton.LeftButton)
    # planned for this machine, launched, and the chat is open
    qtbot.waitUntil(lambda: w.current_page() == "chat", timeout=180_000)
    engine = ctx.engine
    qtbot.waitUntil(lambda: engine.ready, timeout=180_000)
    req = engine.request
    assert req is not None
    assert req.vision
    assert req.subject is not None
    assert req.subject.here
    assert "--mmproj" in req.spec.args
    chat = w.chat_page()
    chat.chat.update_settings("", SHORT)
    png = tmp_path / "Pictures" / "red.png"
    png.parent.mkdir()
    img = QImage(40, 40, QImage.Format.Format_RGB32)
    img.fill(QColor("red"))
    img.save(str(png))
    chat.composer.files_added.emit([str(png)])  # what the Attach button's dialog emits
    qtbot.waitUntil(lambda: len(chat.composer.attachments) == 1, timeout=10_000)
    chat.composer.edit.setPlainText("What colour is this picture?")
    qtbot.keyClick(chat.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: chat.chat.streaming or bool(chat.chat._task), timeout=10_000)
    qtbot.waitUntil(
        lambda: not chat.chat.streaming and chat.chat._task is None, timeout=90_000
    )
    user, answer = chat.view.messages()[0], chat.view.messages()[-1]
    assert len(user.images) == 1
    assert answer.role == "assistant"
    assert answer.content.strip()
    assert ctx.reporter.last is None
    settle(ctx, qtbot, w)


def test_plan_for_another_machine_come_back_and_launch_here(  # type: ignore[no-untyped-def]
    ctx, qtbot, tiny_k3, tmp_path, hardware_file, monkeypatch
) -> None:
    first = own_copy(tiny_k3, tmp_path / "models" / "kimi")
    ctx.update_settings(model_dirs=(str(first.parent.parent),), wizard_done=True)
    here = ctx.services.this_machine()
    w = open_window(ctx, qtbot)
    w.show_page(PageKey.MODELS)
    page = w.models_page()
    mine = page.mine
    qtbot.waitUntil(lambda: len(mine.rows()) == 1, timeout=120_000)
    here_verdict = mine.shown_rows()[0]["verdict"]
    # "Plan for other hardware…": the dialog answers with a machine of 8 GPUs
    h100 = hardware_file("8xH100-2TB")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(h100), ""))
    page.judged_bar.other.click()
    qtbot.waitUntil(
        lambda: mine.judgement is not None and mine.judgement.subject.kind == "file",
        timeout=60_000,
    )
    there = mine.shown_rows()[0]
    assert there["verdict"] == "GPU: everything on the GPUs"
    assert "8xH100-2TB.json" in mine.status.text()
    if not here.gpus:
        assert there["verdict"] != here_verdict
    # come back to this machine
    assert page.judged_bar.back.isVisible()
    page.judged_bar.back.click()
    qtbot.waitUntil(
        lambda: mine.judgement is not None and mine.judgement.subject.here, timeout=60_000
    )
    assert mine.shown_rows()[0]["verdict"] == here_verdict
    # and launch here: planned for this machine, GPUs of the file nowhere in the command
    mine.chat_btn.click()
    engine = ctx.engine
    qtbot.waitUntil(lambda: engine.ready, timeout=180_000)
    req = engine.request
    assert req is not None
    assert req.plan is not None
    assert req.subject is not None
    assert req.subject.here
    assert req.subject.name == (here.label or here.hostname)
    if not here.gpus:
        assert "-ts" not in req.spec.args
        assert "-ngl" not in req.spec.args  # no GPU flag for an engine without GPUs
    assert w.current_page() == "chat"
    settle(ctx, qtbot, w)
