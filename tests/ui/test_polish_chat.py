"""The habits people bring from LM Studio and Jan: top-k, min-p, repeat penalty and seed
per conversation, sent to the real llama-server and kept with the conversation."""

from __future__ import annotations

import json
import urllib.request

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog

from k3desk.ui.chat.page import ChatPage, ChatSettingsDialog

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def page(ctx, qtbot, launch_engine, llama_server, tiny_k3_single):  # type: ignore[no-untyped-def]
    launch_engine(llama_server, tiny_k3_single, vision=False)
    ctx.update_settings(thinking=False)
    p = ChatPage(ctx)
    qtbot.addWidget(p)
    p.resize(1024, 700)
    p.show()
    qtbot.waitExposed(p)
    qtbot.waitUntil(lambda: p.chat.server() is not None, timeout=10_000)
    yield p
    p.closing()


def slots(endpoint) -> list[dict]:  # type: ignore[no-untyped-def]
    req = urllib.request.Request(f"{endpoint.url}/slots", headers=endpoint.headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_top_k_min_p_repeat_penalty_and_seed_reach_llama_server_and_stay(  # type: ignore[no-untyped-def]
    ctx, qtbot, page, monkeypatch
) -> None:
    def fill(dlg: ChatSettingsDialog) -> int:
        for box in (dlg.top_k, dlg.min_p, dlg.repeat_penalty, dlg.seed):
            assert box.isEnabled()  # llama-server reads them all
            assert box.value() == box.minimum()  # unset: the server's own
        dlg.top_k.setValue(7)
        dlg.min_p.setValue(0.1)
        dlg.repeat_penalty.setValue(1.15)
        dlg.seed.setValue(1234)
        dlg.max_tokens.setValue(8)
        dlg.thinking.setChecked(False)
        return int(QDialog.DialogCode.Accepted)

    monkeypatch.setattr(ChatSettingsDialog, "exec", fill)
    page.edit_settings()
    page.composer.edit.setPlainText("Hello")
    qtbot.keyClick(page.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(
        lambda: len(page.view.messages()) == 2 and page.chat._task is None, timeout=60_000
    )
    (slot,) = [s for s in slots(ctx.engine.endpoint()) if s.get("params")][:1]
    params = slot["params"]
    assert params["top_k"] == 7
    assert params["min_p"] == pytest.approx(0.1)
    assert params["repeat_penalty"] == pytest.approx(1.15)
    assert params["seed"] == 1234
    # kept with the conversation: a new window opens it with them
    cid = page.current_id()
    other = ChatPage(ctx)
    qtbot.addWidget(other)
    other.chat.open(cid)
    qtbot.waitUntil(lambda: other.current_id() == cid, timeout=5000)
    seen: list[tuple[int, float, float, int]] = []

    def read(dlg: ChatSettingsDialog) -> int:
        seen.append(
            (dlg.top_k.value(), dlg.min_p.value(), dlg.repeat_penalty.value(), dlg.seed.value())
        )
        return int(QDialog.DialogCode.Rejected)

    monkeypatch.setattr(ChatSettingsDialog, "exec", read)
    other.edit_settings()
    assert seen == [(7, pytest.approx(0.1), pytest.approx(1.15), 1234)]
    other.closing()


def test_the_header_shows_the_model_and_switches_to_another_when_asked(  # type: ignore[no-untyped-def]
    ctx, qtbot, page, tiny_k3, tiny_k3_single
) -> None:
    from k3desk.core.app.cells import shown_path
    from k3desk.core.app.library import add_model, model_id
    from tests.ui.test_nothing_without_asking import answer_switch

    assert tiny_k3.name == tiny_k3_single.name  # two sets of one name, in two folders
    for m in (tiny_k3, tiny_k3_single):
        add_model(ctx.services, m.first_part)
    picker = page.picker
    picker.refresh()
    other = model_id(tiny_k3.first_part)
    qtbot.waitUntil(lambda: picker.findData(other) > 0, timeout=30_000)
    assert picker.currentText().startswith(tiny_k3_single.name)  # the model loaded now
    assert picker.findData(model_id(tiny_k3_single.first_part)) < 0  # not offered again
    ask(qtbot, page, "Hello")
    first = page.current_id()
    pid = ctx.engine.endpoint().pid
    # the same question as "Chat with it" asks, with the load time, and the two told
    # apart by their folders
    seen: list[str] = []
    answer_switch(None, seen)  # "Keep the one running"
    picker.choose(other)
    qtbot.waitUntil(lambda: bool(seen), timeout=60_000)
    name = tiny_k3.name
    here = shown_path(tiny_k3_single.first_part.parent)
    there = shown_path(tiny_k3.first_part.parent)
    assert f"{name} ({here}) is loaded. Stop it and load {name} ({there})?" in seen[0]
    assert "takes up to" in seen[0]  # the plan's load time
    assert "new conversation" in seen[0]
    qtbot.wait(300)
    assert ctx.engine.endpoint().pid == pid  # kept: nothing stopped
    assert page.current_id() == first
    seen.clear()
    answer_switch("Load in a new chat", seen)
    picker.choose(other)
    qtbot.waitUntil(
        lambda: ctx.engine.ready and ctx.engine.request.shard == tiny_k3.first_part,
        timeout=120_000,
    )
    assert page.current_id() != first  # a new conversation for the new model
    assert page.view.messages() == []
    qtbot.waitUntil(lambda: picker.findData(model_id(tiny_k3_single.first_part)) > 0, timeout=5000)


def ask(qtbot, page: ChatPage, text: str) -> None:  # type: ignore[no-untyped-def]
    page.composer.edit.setPlainText(text)
    qtbot.keyClick(page.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(
        lambda: len(page.view.messages()) >= 2 and page.chat._task is None, timeout=60_000
    )
