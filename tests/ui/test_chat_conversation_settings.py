"""Per-conversation settings (system prompt, sampling, thinking and effort) reach the server,
and the copy links of an answer put its text and its code on the clipboard.

The server is the chat tests' OpenAI-compatible stand-in, attached like any remote server,
so the test can read the exact request the chat window sent.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtWidgets import QApplication, QDialog

from k3desk.core.cluster.endpoints import EndpointStore
from k3desk.core.settings import EFFORTS
from k3desk.ui.chat.page import ChatPage, ChatSettingsDialog
from tests.core.chat.conftest import StandIn
from tests.core.chat.conftest import standin as _standin_fixture

standin = _standin_fixture  # the fixture, under its own name, for this module


@pytest.fixture
def page(ctx, qtbot, standin: StandIn) -> Iterator[ChatPage]:  # type: ignore[no-untyped-def]
    EndpointStore(ctx.services.paths).add("standin", standin.url, check=True)
    cluster = ctx.cluster
    cluster.use_endpoint("standin")
    qtbot.waitUntil(lambda: ctx.engine.chat_endpoint() is not None, timeout=5000)
    p = ChatPage(ctx)
    qtbot.addWidget(p)
    p.show()
    yield p
    p.closing()


def send(qtbot, page: ChatPage, text: str) -> None:  # type: ignore[no-untyped-def]
    page.composer.edit.setPlainText(text)
    page.composer.send_btn.click()
    qtbot.waitUntil(
        lambda: (
            len(page.view.messages()) >= 2 and not page.chat.streaming and page.chat._task is None
        ),
        timeout=10_000,
    )


def test_the_dialog_s_settings_are_sent_and_kept_with_the_conversation(  # type: ignore[no-untyped-def]
    qtbot, page, standin, monkeypatch
) -> None:
    def fill_and_accept(dlg: ChatSettingsDialog) -> int:
        dlg.prompt.setPlainText("You are terse.")
        dlg.temperature.setValue(0.6)
        dlg.top_p.setValue(0.9)
        dlg.thinking.setChecked(True)
        dlg.effort.setCurrentIndex(dlg.effort.findData(EFFORTS[-1]))
        return int(QDialog.DialogCode.Accepted)

    monkeypatch.setattr(ChatSettingsDialog, "exec", fill_and_accept)
    page.edit_settings()  # before the first message: applies to the chat it starts
    assert page.chat.conversation_settings()[1].thinking_effort == EFFORTS[-1]
    send(qtbot, page, "Hello")
    body = standin.requests[-1]
    assert body["messages"][0] == {"role": "system", "content": "You are terse."}
    assert body["messages"][-1]["content"] == "Hello"
    assert body["temperature"] == 0.6
    assert body["top_p"] == 0.9
    assert body["chat_template_kwargs"] == {"thinking": True, "thinking_effort": EFFORTS[-1]}

    # thinking off for this conversation: the effort is not sent either
    def thinking_off(dlg: ChatSettingsDialog) -> int:
        assert dlg.prompt.toPlainText() == "You are terse."  # the dialog shows what is kept
        dlg.thinking.setChecked(False)
        return int(QDialog.DialogCode.Accepted)

    monkeypatch.setattr(ChatSettingsDialog, "exec", thinking_off)
    page.edit_settings()
    qtbot.waitUntil(lambda: not page.chat.conversation_settings()[1].thinking, timeout=5000)
    page.composer.edit.setPlainText("Again")
    page.composer.send_btn.click()
    qtbot.waitUntil(
        lambda: len(page.view.messages()) == 4 and page.chat._task is None, timeout=10_000
    )
    body = standin.requests[-1]
    assert body["chat_template_kwargs"] == {"thinking": False}
    assert body["messages"][0]["content"] == "You are terse."


def test_copy_links_copy_the_answer_and_its_code(qtbot, page, standin) -> None:  # type: ignore[no-untyped-def]
    standin.tokens = [
        ("content", "Run this:\n\n```python\nprint('hi')\n```\n"),
        ("content", "Done."),
    ]
    send(qtbot, page, "Show me code")
    answer = page.view.messages()[-1]
    html = page.view.toHtml()
    assert f"k3:copy-code/{answer.id}/0" in html
    page.view._anchor(QUrl(f"k3:copy-code/{answer.id}/0"))  # what a click on the link does
    assert QApplication.clipboard().text().strip() == "print('hi')"
    assert f"k3:copy/{answer.id}" in html
    page.view._anchor(QUrl(f"k3:copy/{answer.id}/0"))
    assert QApplication.clipboard().text() == answer.content
    assert "Done." in answer.content


def test_a_closed_chat_opens_no_new_connection(qtbot, page, standin) -> None:  # type: ignore[no-untyped-def]
    """A background question still queued when the window closes gets no new client
    (it would never be closed); the chat says so instead of connecting."""
    from k3desk.core.errors import ChatError

    endpoint = page.ctx.engine.chat_endpoint()
    page.closing()
    with pytest.raises(ChatError, match="closed"):
        page.chat.client(endpoint)
    page.chat.find_server()  # the late task ends quietly
    qtbot.wait(300)
    assert page.chat._client is None
