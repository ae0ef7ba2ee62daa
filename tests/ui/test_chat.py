"""The chat window against the real llama-server serving the tiny Kimi-K3 (+ projector)."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDropEvent, QImage
from PySide6.QtWidgets import QApplication

from k3desk.core.chat.model import ChatSettings
from k3desk.ui.chat.page import ChatPage

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# Random weights: a fixed seed, a bounded length and ignore_eos make answers repeatable.
SHORT = ChatSettings(thinking=False, max_tokens=24, seed=1, extra_body={"ignore_eos": True})
LONG = ChatSettings(max_tokens=3000, seed=2, extra_body={"ignore_eos": True})


def png_file(path: Path, color: str = "red", size: int = 40) -> Path:
    img = QImage(size, size, QImage.Format.Format_RGB32)
    img.fill(QColor(color))
    img.save(str(path))
    return path


@pytest.fixture
def page(ctx, qtbot, launch_engine, llama_server, tiny_k3):  # type: ignore[no-untyped-def]
    launch_engine(llama_server, tiny_k3)
    p = ChatPage(ctx)
    p.chat.update_settings("", SHORT)  # settings of the conversation the first send creates
    qtbot.addWidget(p)
    p.resize(1100, 760)
    p.show()
    return p


def send(qtbot, page: ChatPage, text: str) -> None:  # type: ignore[no-untyped-def]
    page.composer.edit.setPlainText(text)
    qtbot.keyClick(page.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: page.chat.streaming or bool(page.chat._task), timeout=5000)


def wait_idle(qtbot, page: ChatPage) -> None:  # type: ignore[no-untyped-def]
    qtbot.waitUntil(lambda: not page.chat.streaming and page.chat._task is None, timeout=60_000)


def db_rows(ctx) -> list[tuple]:  # type: ignore[no-untyped-def]
    con = sqlite3.connect(ctx.services.paths.history_db)
    try:
        return con.execute(
            "SELECT id, parent_id, role, content, partial, finish_reason FROM messages ORDER BY id"
        ).fetchall()
    finally:
        con.close()


def test_send_streams_an_answer_and_enter_vs_shift_enter(ctx, qtbot, page) -> None:  # type: ignore[no-untyped-def]
    assert not page.composer.send_btn.isEnabled()  # nothing typed yet
    assert "Type a message" in page.composer.send_btn.toolTip()
    page.composer.edit.setPlainText("first line")
    page.composer.edit.moveCursor(page.composer.edit.textCursor().MoveOperation.End)
    qtbot.keyClick(page.composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert page.composer.edit.toPlainText() == "first line\n"  # Shift+Enter: new line, no send
    assert not page.chat.streaming
    page.composer.edit.insertPlainText("second line")
    qtbot.keyClick(page.composer.edit, Qt.Key.Key_Return)
    updates: list[int] = []
    page.chat.stream_update.connect(lambda vm: updates.append(len(vm.content)))
    wait_idle(qtbot, page)
    msgs = page.view.messages()
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[0].content == "first line\nsecond line"
    assert msgs[1].content  # the model answered
    assert not msgs[1].partial
    assert updates  # streamed in batches, not only at the end
    assert "tok/s" in page.status.text()
    assert page.composer.edit.toPlainText() == ""
    rows = db_rows(ctx)
    assert [r[2] for r in rows] == ["user", "assistant"]
    assert rows[1][3] == msgs[1].content
    assert page.list.count() == 1


def test_esc_stops_and_keeps_the_partial_answer(ctx, qtbot, page) -> None:  # type: ignore[no-untyped-def]
    page.chat.update_settings("", LONG)
    first: list[int] = []
    page.chat.stream_update.connect(lambda vm: first.append(1))

    def stop_on_first_batch() -> None:
        if len(first) == 1:
            qtbot.keyClick(page.composer.edit, Qt.Key.Key_Escape)

    page.chat.stream_update.connect(lambda _vm: stop_on_first_batch())
    send(qtbot, page, "Write a very long story about llamas")
    wait_idle(qtbot, page)
    answer = page.view.messages()[-1]
    rows = db_rows(ctx)
    assert rows[-1][2] == "assistant"
    assert rows[-1][5] == "stopped"  # 3000 tokens take far longer than one batch
    assert answer.partial
    assert "stopped" in answer.partial_note
    assert rows[-1][4] == 1
    assert answer.reasoning  # what arrived before the stop is kept
    assert "Partial answer" in page.view.toPlainText()
    assert not page.composer.stop_btn.isVisible()


def test_regenerate_and_edit_keep_old_branches(ctx, qtbot, page) -> None:  # type: ignore[no-untyped-def]
    send(qtbot, page, "Question one")
    wait_idle(qtbot, page)
    first_answer = page.view.messages()[-1]
    page.view.action.emit("regenerate", first_answer.id, 0)
    wait_idle(qtbot, page)
    msgs = page.view.messages()
    assert len(msgs) == 2
    assert msgs[-1].id != first_answer.id
    assert msgs[-1].branch == (2, 2)
    assert "2/2" in page.view.toPlainText()
    # back to the first answer
    page.view.action.emit("branch", msgs[-1].id, -1)
    qtbot.waitUntil(lambda: page.view.messages()[-1].id == first_answer.id, timeout=5000)
    assert page.view.messages()[-1].branch == (1, 2)

    # edit the question: a new branch; the old question stays
    user = page.view.messages()[0]
    page.start_edit(int(user.id))
    assert page.composer.edit.toPlainText() == "Question one"
    assert page.editing_bar.isVisible()
    page.composer.edit.setPlainText("Question one, edited")
    qtbot.keyClick(page.composer.edit, Qt.Key.Key_Return)
    wait_idle(qtbot, page)
    msgs = page.view.messages()
    assert msgs[0].content == "Question one, edited"
    assert msgs[0].branch == (2, 2)
    users = [r for r in db_rows(ctx) if r[2] == "user"]
    assert [u[3] for u in users] == ["Question one", "Question one, edited"]
    assert users[0][1] == users[1][1]  # siblings: same parent
    page.view.action.emit("branch", msgs[0].id, -1)
    qtbot.waitUntil(lambda: page.view.messages()[0].content == "Question one", timeout=5000)


def test_reasoning_arrives_in_a_collapsible_block(ctx, qtbot, page) -> None:  # type: ignore[no-untyped-def]
    page.chat.update_settings(
        "", ChatSettings(max_tokens=24, seed=1, extra_body={"ignore_eos": True})
    )
    send(qtbot, page, "Think about it")
    wait_idle(qtbot, page)
    answer = page.view.messages()[-1]
    assert answer.reasoning  # the K3 template puts thinking in reasoning_content
    text = page.view.toPlainText()
    page.view.action.disconnect()
    if not answer.content.strip():  # only reasoning (24 tokens): shown open, it is all there is
        assert "▾ Reasoning" in text
        assert answer.reasoning.split()[0] in text
        page.view.toggle_reasoning(answer.id)
        assert "▸ Reasoning" in page.view.toPlainText()
        return
    assert "▸ Reasoning" in text
    assert answer.reasoning[:30] not in text  # collapsed
    page.view.toggle_reasoning(answer.id)
    assert "▾ Reasoning" in page.view.toPlainText()
    assert answer.reasoning.split()[0] in page.view.toPlainText()


def test_images_by_file_drop_and_paste_are_sent_and_removable(ctx, qtbot, page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = png_file(tmp_path / "a.png", "red")
    b = png_file(tmp_path / "b.png", "blue")
    page.composer.files_added.emit([str(a)])  # what the Attach button's dialog emits
    qtbot.waitUntil(lambda: len(page.composer.attachments) == 1, timeout=10_000)
    # drop a file on the composer
    md = QMimeData()
    md.setUrls([QUrl.fromLocalFile(str(b))])
    drop = QDropEvent(
        QPointF(10, 10),
        Qt.DropAction.CopyAction,
        md,
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
    )
    page.composer.edit.dropEvent(drop)
    qtbot.waitUntil(lambda: len(page.composer.attachments) == 2, timeout=10_000)
    # paste image data
    img = QImage(30, 20, QImage.Format.Format_RGB32)
    img.fill(QColor("green"))
    QApplication.clipboard().setImage(img)
    page.composer.edit.paste()
    qtbot.waitUntil(lambda: len(page.composer.attachments) == 3, timeout=10_000)
    assert [t.attachment.image.width for t in page.composer.thumbs()] == [40, 40, 30]
    # remove the dropped one
    page.composer.thumbs()[1].findChild(type(page.composer.attach), "removeAttachment").click()
    assert [a.image.name.rsplit("/", 1)[-1] for a in page.composer.attachments] == [
        "a.png",
        "pasted image",
    ]
    send(qtbot, page, "What is in these pictures?")
    wait_idle(qtbot, page)
    user = page.view.messages()[0]
    assert len(user.images) == 2
    assert not page.composer.attachments  # cleared after sending
    assert page.view.messages()[-1].content
    con = sqlite3.connect(ctx.services.paths.history_db)
    assert con.execute("SELECT COUNT(*) FROM message_images").fetchone()[0] == 2
    con.close()


def test_images_are_refused_up_front_without_vision(
    ctx, qtbot, launch_engine, llama_server, tiny_k3, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    launch_engine(llama_server, tiny_k3, vision=False)
    p = ChatPage(ctx)
    qtbot.addWidget(p)
    p.show()
    p.composer.files_added.emit([str(png_file(tmp_path / "x.png"))])
    qtbot.waitUntil(lambda: p.composer.notice.isVisible(), timeout=10_000)
    assert "no vision" in p.composer.notice.text()
    assert "mmproj" in p.composer.notice.text()
    assert not p.composer.attachments


def test_not_an_image_is_refused_with_the_reason(ctx, qtbot, page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fake = tmp_path / "notes.png"
    fake.write_text("just text")
    page.composer.files_added.emit([str(fake)])
    qtbot.waitUntil(lambda: page.composer.notice.isVisible(), timeout=10_000)
    assert "notes.png" in page.composer.notice.text()
    assert "not an image" in page.composer.notice.text()


def test_history_survives_an_app_restart(ctx, qtbot, page, services) -> None:  # type: ignore[no-untyped-def]
    send(qtbot, page, "Remember me")
    wait_idle(qtbot, page)
    answer = page.view.messages()[-1].content
    page.chat.rename(page.chat.current.conversation.id, "Kept chat")
    qtbot.waitUntil(
        lambda: page.list.count() == 1 and page.list.item(0).toolTip() == "Kept chat", timeout=5000
    )
    page.closing()

    # a new app on the same K3DESK_HOME
    from k3desk.app import Services
    from k3desk.ui.main import create_context

    ctx2 = create_context(Services(), QApplication.instance())
    ctx2.reporter.show_dialogs = False
    p2 = ChatPage(ctx2)
    qtbot.addWidget(p2)
    qtbot.waitUntil(lambda: p2.list.count() == 1, timeout=5000)
    assert p2.list.item(0).toolTip() == "Kept chat"
    p2.list.setCurrentRow(0)
    qtbot.waitUntil(lambda: len(p2.view.messages()) == 2, timeout=5000)
    assert p2.view.messages()[0].content == "Remember me"
    assert p2.view.messages()[1].content == answer
    # search finds it by a word of the question
    p2.search.setText("remember")
    qtbot.waitUntil(lambda: p2.list.count() == 1, timeout=5000)
    p2.search.setText("zzzz-nothing")
    qtbot.waitUntil(lambda: p2.list.count() == 0, timeout=5000)
    assert p2.list_empty.text() == "No conversation matches."
    p2.closing()
    ctx2.tasks.shutdown()


def test_export_rename_and_delete(ctx, qtbot, page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    send(qtbot, page, "Export me")
    wait_idle(qtbot, page)
    cid = page.chat.current.conversation.id
    md, js = tmp_path / "c.md", tmp_path / "c.json"
    page.export(cid, "md", md)
    page.export(cid, "json", js)
    qtbot.waitUntil(lambda: md.exists() and js.exists(), timeout=5000)
    assert "Export me" in md.read_text()
    import json

    assert json.loads(js.read_text())["messages"][0]["content"] == "Export me"
    page.rename(cid, "Renamed")
    qtbot.waitUntil(lambda: page.list.item(0).toolTip() == "Renamed", timeout=5000)
    page.delete(cid, confirm=False)
    qtbot.waitUntil(lambda: page.list.count() == 0, timeout=5000)
    assert page.view.messages() == []
    assert db_rows(ctx) == []


def test_a_partial_answer_is_kept_when_the_engine_is_killed(ctx, qtbot, page) -> None:  # type: ignore[no-untyped-def]
    engine = ctx.engine
    pid = engine.supervisor.pid
    assert pid
    killed: list[bool] = []

    def kill_once(_vm) -> None:  # type: ignore[no-untyped-def]
        if not killed:
            killed.append(True)
            os.kill(pid, signal.SIGKILL)

    page.chat.update_settings("", LONG)
    page.chat.stream_update.connect(kill_once)
    send(qtbot, page, "Tell me everything you know")
    wait_idle(qtbot, page)
    rows = db_rows(ctx)
    answer = page.view.messages()[-1]
    assert killed
    assert rows[-1][5] == "interrupted"
    assert answer.partial
    assert "engine stopped answering" in answer.partial_note
    assert rows[-1][4] == 1  # stored as partial
    assert answer.reasoning  # with the text that arrived
    assert "Partial answer" in page.view.toPlainText()
