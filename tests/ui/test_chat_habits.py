"""The habits people bring from other chat apps, against the real llama-server serving the
tiny Kimi-K3: Ctrl+N, Ctrl+F with snippets and a jump to the match, Ctrl+E and Delete,
the model's name and per-conversation figures, reasoning shown while it streams."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox

from k3desk.core.chat.model import ChatSettings
from k3desk.ui.chat.page import ChatPage
from k3desk.ui.chat.view import MessageView, MessageVM

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SHORT = ChatSettings(thinking=False, max_tokens=16, seed=1, extra_body={"ignore_eos": True})


@pytest.fixture
def page(ctx, qtbot, launch_engine, llama_server, tiny_k3):  # type: ignore[no-untyped-def]
    launch_engine(llama_server, tiny_k3, vision=False)
    ctx.update_settings(thinking=False)
    p = ChatPage(ctx)
    p.chat.update_settings("", SHORT)
    qtbot.addWidget(p)
    p.resize(1024, 700)
    p.show()
    qtbot.waitExposed(p)
    return p


def ask(qtbot, page: ChatPage, text: str) -> None:  # type: ignore[no-untyped-def]
    page.composer.edit.setPlainText(text)
    qtbot.keyClick(page.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: page.chat.streaming or bool(page.chat._task), timeout=5000)
    qtbot.waitUntil(lambda: not page.chat.streaming and page.chat._task is None, timeout=60_000)


def conversations(ctx) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    con = sqlite3.connect(ctx.services.paths.history_db)
    try:
        return con.execute("SELECT id, title FROM conversations ORDER BY id").fetchall()
    finally:
        con.close()


def test_ctrl_n_starts_a_new_chat_that_gets_the_next_message(ctx, qtbot, page) -> None:  # type: ignore[no-untyped-def]
    assert page.model_label.text() == f"{ctx.engine.request.model_name} · this machine"
    assert not page.export_btn.isEnabled()
    assert "first message" in page.export_btn.toolTip()
    ask(qtbot, page, "Alpha question")
    assert "last answer" in page.status.text()
    assert "context" in page.status.text()
    assert page.export_btn.isEnabled()
    assert page.delete_btn.isEnabled()
    page.composer.edit.setFocus()
    qtbot.keyClick(page.composer.edit, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert page.title.text() == "New chat"
    assert page.view.messages() == []
    # the figures were the other conversation's
    assert "last answer" not in page.status.text()
    assert "context" not in page.status.text()
    assert not page.export_btn.isEnabled()
    ask(qtbot, page, "Beta question")
    rows = conversations(ctx)
    assert len(rows) == 2  # the second message started a conversation of its own
    assert next(m.content for m in page.view.messages()) == "Beta question"
    assert "last answer" in page.status.text()
    # back in the first one, its own figures come back
    qtbot.waitUntil(lambda: page.list.count() == 2, timeout=5000)
    first = next(i for i in range(page.list.count()) if "Alpha" in page.list.item(i).toolTip())
    page.list.setCurrentRow(first)
    qtbot.waitUntil(lambda: page.title.text().startswith("Alpha"), timeout=5000)
    assert "last answer" in page.status.text()


def test_ctrl_f_search_shows_snippets_and_jumps_to_the_match(ctx, qtbot, page) -> None:  # type: ignore[no-untyped-def]
    ask(qtbot, page, "Where do the pelicans nest in winter?")
    page.new_chat()
    ask(qtbot, page, "Something else entirely")
    qtbot.keyClick(page.composer.edit, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert page.search.hasFocus()
    qtbot.keyClicks(page.search, "pelicans")
    qtbot.waitUntil(lambda: page.list.count() == 1, timeout=5000)
    shown = page.search_hit_text(0)
    assert "pelicans nest" in shown  # the words around the match, not only the title
    cell = page.list.itemWidget(page.list.item(0))
    assert "<b style=" in cell.text()
    assert ">pelicans</b>" in cell.text()
    page.list.setCurrentRow(0)
    qtbot.waitUntil(lambda: page.view.marked() == ["pelicans"], timeout=5000)
    assert page.view.textCursor().block().text().find("pelicans") >= 0  # the view is there
    page.search.clear()
    qtbot.waitUntil(lambda: page.list.count() == 2, timeout=5000)


def test_export_is_named_after_the_title_and_confirmed_with_a_link(
    ctx, qtbot, page, tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    ask(qtbot, page, "Export me")
    cid = page.current_id()
    page.rename(cid, 'Plans: Q3/Q4 "draft"?')
    qtbot.waitUntil(lambda: page.title.text() == 'Plans: Q3/Q4 "draft"?', timeout=5000)
    proposed: list[str] = []
    target = tmp_path / "out.md"

    def save(_parent, _title, name, _filter):  # type: ignore[no-untyped-def]
        proposed.append(name)
        return str(target), ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save)
    qtbot.keyClick(page.composer.edit, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: target.exists() and page.notice.isVisible(), timeout=5000)
    assert Path(proposed[0]).name == "Plans Q3 Q4 draft.md"
    assert "resources" not in Path(proposed[0]).parts  # documents, or home; not the app's
    assert f'href="file://{target}"' in page.notice.text()
    assert "Export me" in target.read_text()


def test_delete_asks_first_from_the_header_and_the_delete_key(  # type: ignore[no-untyped-def]
    ctx, qtbot, page, monkeypatch
) -> None:
    ask(qtbot, page, "Delete me")
    asked: list[str] = []
    answer = [QMessageBox.StandardButton.Cancel]

    def question(_parent, _title, text, *_a):  # type: ignore[no-untyped-def]
        asked.append(text)
        return answer[0]

    monkeypatch.setattr(QMessageBox, "question", question)
    page.delete_btn.click()
    assert asked
    assert "Delete me" in asked[0]
    qtbot.wait(200)
    assert len(conversations(ctx)) == 1  # cancelled: kept
    answer[0] = QMessageBox.StandardButton.Yes
    qtbot.waitUntil(lambda: page.list.count() == 1, timeout=5000)
    page.list.setCurrentRow(0)
    page.list.setFocus()
    qtbot.keyClick(page.list, Qt.Key.Key_Delete)
    assert len(asked) == 2
    qtbot.waitUntil(lambda: conversations(ctx) == [], timeout=5000)
    qtbot.waitUntil(lambda: page.list.count() == 0, timeout=5000)
    assert page.title.text() == "New chat"


def test_an_answer_that_is_all_reasoning_so_far_shows_it_streaming(qtbot) -> None:  # type: ignore[no-untyped-def]
    view = MessageView()
    qtbot.addWidget(view)
    q = MessageVM(id="1", role="user", content="Why?")
    a = MessageVM(id="2", role="assistant", content="", reasoning="", streaming=True)
    view.set_messages([q])
    view.begin_stream(a)
    a.reasoning = "The user asks why. Let me weigh the first cause"
    view.update_stream(a)
    text = view.toPlainText()
    assert "Thinking…" in text
    assert "Let me weigh the first cause" in text  # visible while it streams
    a.content = "Because."
    view.end_stream(a)
    text = view.toPlainText()
    assert "Because." in text
    assert "Let me weigh" not in text  # folded away once the answer comes
