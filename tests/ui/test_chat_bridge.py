"""The chat window through an attached SparkInfer bridge, as a DGX Spark owner uses it:
attach the recipe's bridge on the Cluster page, chat, switch thinking off.

The bridge is the recipe's bridge stand-in in front of the TP3 rank 0 stand-in
(tests/fakes/sparkinfer), whose model, while thinking, strays from K3's format (a tools
section inside its response, a stray ``[EOS]``), which the bridge hands through.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QDialog

from k3desk.core.chat.channels import MARKERS
from k3desk.ui.chat.page import ChatSettingsDialog
from k3desk.ui.window import MainWindow
from tests.fakes.sparkinfer.local import LocalBridge, start_local_bridge

pytestmark = pytest.mark.gui

REPLY = (
    "The user wrote something<|close|>think<|sep|><|open|>response<|sep|>hello "
    "<|open|>tools<|sep|>world [EOS]<|close|>response<|sep|><|close|>message<|sep|>"
    "<|end_of_msg|>"
)


@pytest.fixture
def bridge(tmp_path: Path) -> Iterator[LocalBridge]:
    b = start_local_bridge(
        tmp_path / "bridge",
        env={"FAKE_SPARKINFER_REPLY": REPLY, "FAKE_SPARKINFER_TOKEN_S": "0.01"},
    )
    try:
        yield b
    finally:
        b.stop()


def send(qtbot, chat, text: str) -> None:  # type: ignore[no-untyped-def]
    before = len(chat.view.messages())
    chat.composer.edit.setPlainText(text)
    chat.composer.send_btn.click()
    qtbot.waitUntil(
        lambda: (
            len(chat.view.messages()) >= before + 2
            and not chat.chat.streaming
            and chat.chat._task is None
        ),
        timeout=15_000,
    )


def test_chat_through_an_attached_bridge(ctx, qtbot, bridge: LocalBridge, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    cluster = w.show_page("cluster")
    panel = cluster.servers
    cluster.tabs.setCurrentWidget(panel)
    panel.name.setText("sparks")
    panel.url.setText(bridge.url + "/v1")
    panel.key.setText(bridge.api_key)
    panel.attach_btn.click()
    qtbot.waitUntil(lambda: panel.table.rowCount() == 1 and "in use" in _row(panel), timeout=10_000)
    # what it is, found out and shown with it
    assert panel.table.item(0, 2).text().startswith("SparkInfer bridge (engine 127.0.0.1:")
    assert "It is a SparkInfer bridge" in panel.result.text()
    assert "a top-level \"thinking\" flag and no effort" in panel.kind_note.text()

    chat = w.show_page("chat")
    # the status line says where the chat goes, and what that is
    qtbot.waitUntil(lambda: "SparkInfer bridge" in chat.status.text(), timeout=5000)
    assert chat.status.text().startswith("Attached server sparks (http://127.0.0.1:")

    send(qtbot, chat, "hello over three sparks")
    answer = chat.view.messages()[-1]
    assert answer.reasoning == "The user wrote something"  # apart from the answer
    assert answer.content.strip() == "hello world"  # the real answer, not the reasoning
    shown = chat.view.toPlainText()
    assert not [m for m in MARKERS if m in shown], shown  # no control token, anywhere
    assert "hello world" in shown
    # the bridge reports no usage or timings: the speed is measured, and said to be
    assert "tok/s (measured by k3desk)" in answer.stats
    assert "last answer ≈ " in chat.status.text()
    assert "tok/s (measured by k3desk)" in chat.status.text()
    assert "(estimated by k3desk)" in chat.status.text()  # and the context it used

    # the settings offer what the bridge takes: no effort, no sampling
    def thinking_off(dlg: ChatSettingsDialog) -> int:
        assert not dlg.effort.isEnabled()
        assert not dlg.temperature.isEnabled()
        assert "takes no thinking effort" in dlg.server_note.text()
        assert "at most 512 tokens per answer" in dlg.server_note.text()
        assert dlg.max_tokens.maximum() == 512
        dlg.thinking.setChecked(False)
        return int(QDialog.DialogCode.Accepted)

    monkeypatch.setattr(ChatSettingsDialog, "exec", thinking_off)
    chat.edit_settings()
    qtbot.waitUntil(lambda: not chat.chat.conversation_settings()[1].thinking, timeout=5000)
    send(qtbot, chat, "hello over three sparks")
    plain = chat.view.messages()[-1]
    assert plain.reasoning == ""
    assert plain.content == "Neuron TP3 stand-in heard: hello over three sparks"
    assert not [m for m in MARKERS if m in chat.view.toPlainText()]
    assert ctx.reporter.last is None  # nothing went wrong on the way


def _row(panel) -> str:  # type: ignore[no-untyped-def]
    t = panel.table
    return " ".join(t.item(0, j).text() for j in range(t.columnCount()) if t.item(0, j))
