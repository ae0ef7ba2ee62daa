"""Nothing stops, replaces or discards without asking: "Chat with it" on a second model
asks (with its load time) before stopping the one loaded, the new model starts a new
conversation, and every view says the same while it loads; a relaunch's notice goes once
the engine is ready; the engine's state is said once."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QLabel, QMessageBox

from k3desk.core.app.background import LAST_MODEL_KEY, LastModel
from k3desk.core.app.cells import shown_path
from k3desk.core.chat.model import ChatSettings
from k3desk.ui.pages import PageKey
from k3desk.ui.window import MainWindow
from tests.ui.test_chat import send, wait_idle

SHORT = ChatSettings(thinking=False, max_tokens=8, seed=1, extra_body={"ignore_eos": True})


@pytest.fixture
def window(ctx, qtbot):  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.resize(1366, 768)
    w.show()
    return w


def answer_switch(button_text: str | None, seen: list[str]) -> None:
    """Click ``button_text`` in the switch question (None: keep the running model)."""

    def click() -> None:
        box = next(
            (w for w in QApplication.topLevelWidgets() if w.objectName() == "switchModelBox"),
            None,
        )
        if not isinstance(box, QMessageBox) or not box.isVisible():
            QTimer.singleShot(20, click)
            return
        seen.append(f"{box.text()}\n{box.informativeText()}")
        for b in box.buttons():
            if (button_text is None and box.buttonRole(b) == QMessageBox.ButtonRole.RejectRole) or (
                b.text() == button_text
            ):
                b.click()
                return

    QTimer.singleShot(20, click)


def visible_texts(window, needle: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [
        lab.objectName()
        for lab in window.findChildren(QLabel)
        if lab.isVisible() and needle in lab.text()
    ]


def test_the_engine_state_is_said_once(window, qtbot) -> None:  # type: ignore[no-untyped-def]
    # D17: "Engine: not running" in the chat's status line and in the status bar
    window.show_page(PageKey.CHAT)
    qtbot.wait(50)
    assert visible_texts(window, "Engine: not running") == ["statusEngine"]


def test_the_engine_page_says_not_running_once(window, qtbot) -> None:  # type: ignore[no-untyped-def]
    # D17: "Engine: not running." above and "Not running" in the API's address field
    from PySide6.QtWidgets import QLineEdit

    window.show_page(PageKey.ENGINE)
    qtbot.wait(50)
    page = window.engine_page()
    said = [
        w.text()
        for w in page.findChildren(QLabel) + page.findChildren(QLineEdit)
        if w.isVisible() and "not running" in w.text().lower()
    ]
    assert len(said) == 1, said
    assert not page.url.copy.isEnabled()  # no address to copy


@pytest.mark.engine
@pytest.mark.slow
def test_a_relaunch_notice_goes_when_ready_and_the_hint_names_the_button(  # type: ignore[no-untyped-def]
    window, qtbot, llama_server, tiny_k3_single
) -> None:
    ctx = window.ctx
    ctx.update_settings(engine_binary=str(llama_server), ctx=1024)
    last = LastModel(str(tiny_k3_single.first_part), "", tiny_k3_single.name)
    ctx.remember(**{LAST_MODEL_KEY: last.to_json()})
    window.show_page(PageKey.CHAT)
    chat = window.chat_page()
    chat._engine_changed()  # the last model as a new start finds it
    assert chat.relaunch_btn.isVisible()
    # D11: the hint beside a Relaunch button points at it, not at the Engine page
    hint = chat.composer.hint.text()
    assert f"press Relaunch {tiny_k3_single.name} above" in hint
    assert "start Kimi-K3 on the Engine page" not in hint
    chat.relaunch_btn.click()
    assert chat.composer.notice.isVisible()
    assert chat.composer.notice.text() == f"Relaunching {tiny_k3_single.name}…"
    engine = ctx.engine
    qtbot.waitUntil(lambda: engine.ready, timeout=120_000)
    # D10: the notice does not outlive the relaunch
    assert not chat.composer.notice.isVisible()
    engine.stop()
    qtbot.waitUntil(lambda: not engine.running, timeout=60_000)


@pytest.mark.engine
@pytest.mark.slow
def test_chat_with_a_second_model_asks_and_starts_a_new_conversation(  # type: ignore[no-untyped-def]
    window, qtbot, llama_server, tiny_k3, tiny_k3_single
) -> None:
    # D6: "Chat with it" on a second model stopped the loaded one without asking, the
    # composer said "No engine is running" while the status bar said loading, and the
    # new model went on with the old conversation
    ctx = window.ctx
    ctx.update_settings(engine_binary=str(llama_server), ctx=1024)
    window.show_page(PageKey.MODELS)
    mine = window.models_page().mine
    mine.add_paths([tiny_k3_single.first_part, tiny_k3.first_part])
    qtbot.waitUntil(lambda: len(mine.rows()) == 2, timeout=60_000)
    engine = ctx.engine
    chat = window.chat_page()
    hints: list[tuple[str, str, str]] = []  # (state, composer hint, status bar) while loading
    engine.state_changed.connect(
        lambda s, _m: hints.append((s, chat.composer.hint.text(), window.status_engine.text()))
    )
    mine.select(str(tiny_k3_single.first_part))
    mine.chat_btn.click()  # nothing runs: no question
    qtbot.waitUntil(lambda: engine.ready, timeout=120_000)
    assert engine.request.shard == tiny_k3_single.first_part
    loading = [h for h in hints if h[0] in ("starting", "loading")]
    assert loading
    for _state, hint, status in loading:
        assert "No engine is running" not in hint
        assert f"{tiny_k3_single.name} is loading ({status})" in hint
    chat.chat.update_settings("", SHORT)
    send(qtbot, chat, "hello")
    wait_idle(qtbot, chat)
    first = chat.chat.current
    assert first is not None

    # the second model: asked, kept when declined
    window.show_page(PageKey.MODELS)
    mine.select(str(tiny_k3.first_part))
    seen: list[str] = []
    answer_switch(None, seen)
    mine.chat_btn.click()
    qtbot.waitUntil(lambda: bool(seen), timeout=60_000)
    qtbot.waitUntil(lambda: mine.chat_btn.isEnabled(), timeout=10_000)
    # one name, two folders: each named with its folder
    here = shown_path(tiny_k3_single.first_part.parent)
    there = shown_path(tiny_k3.first_part.parent)
    name = tiny_k3.name
    assert f"{name} ({here}) is loaded. Stop it and load {name} ({there})?" in seen[0]
    assert "takes up to" in seen[0]  # the plan's load time
    assert "new conversation" in seen[0]
    assert engine.ready
    assert engine.request.shard == tiny_k3_single.first_part
    assert chat.chat.current is first

    # accepted: the new model, in a new conversation; the old one stays in the list
    seen.clear()
    answer_switch("Load in a new chat", seen)
    mine.chat_btn.click()
    qtbot.waitUntil(
        lambda: engine.request is not None and engine.request.shard == tiny_k3.first_part,
        timeout=60_000,
    )
    assert chat.chat.current is None
    qtbot.waitUntil(lambda: engine.ready, timeout=120_000)
    assert chat.list.count() >= 1
    # the same model again: already running, nothing stops
    mine.select(str(tiny_k3.first_part))
    before = len(engine.attempts())
    mine.chat_btn.click()
    assert "already running" in mine.status.text()
    assert len(engine.attempts()) == before
    engine.stop()
    qtbot.waitUntil(lambda: not engine.running, timeout=60_000)
