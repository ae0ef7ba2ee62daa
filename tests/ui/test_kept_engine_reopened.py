"""Reopened with the engine kept: the Engine page shows the plan the engine was launched
with, and the chat's footer the context limit it runs with (D19)."""

from __future__ import annotations

import pytest

from k3desk.core.chat.model import ChatSettings
from k3desk.ui.chat.page import ChatPage
from k3desk.ui.engine.page import EnginePage
from tests.ui.test_chat import send, wait_idle

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SHORT = ChatSettings(thinking=False, max_tokens=8, seed=1, extra_body={"ignore_eos": True})


def test_a_kept_engine_shows_its_plan_and_context_after_reopening(  # type: ignore[no-untyped-def]
    ctx, qtbot, qapp, llama_server, tiny_k3_single
) -> None:
    from k3desk.app import Services
    from k3desk.ui.main import create_context

    ctx.update_settings(engine_binary=str(llama_server), ctx=1024)
    page = EnginePage(ctx)
    qtbot.addWidget(page)
    page.panel.shard.setText(str(tiny_k3_single.first_part))
    page.panel.launch_btn.click()
    qtbot.waitUntil(lambda: ctx.engine.ready, timeout=120_000)
    chat = ChatPage(ctx)
    qtbot.addWidget(chat)
    chat.chat.update_settings("", SHORT)
    send(qtbot, chat, "hello")
    wait_idle(qtbot, chat)
    assert "/ 1,024" in chat.status.text()
    conversation = chat.chat.current.conversation.id
    assert ctx.engine.keep_in_background()

    # the next start, on the same home: the kept engine is taken up
    again = create_context(Services(), qapp)
    again.reporter.show_dialogs = False
    try:
        again.engine.take_up_background()
        qtbot.waitUntil(lambda: again.engine.ready, timeout=30_000)
        assert again.engine.background is not None
        # tools are still shown the address the keeper's front holds, not the engine's port
        address = ctx.engine.address()
        assert address is not None
        assert address != ctx.engine.endpoint().url
        assert again.engine.address() == address
        assert again.engine.message.startswith(f"Listening on {address}:")
        page2 = EnginePage(again)
        qtbot.addWidget(page2)
        page2.activated()
        qtbot.waitUntil(lambda: page2.url.edit.text() == f"{address}/v1", timeout=10_000)
        assert "No launch plan yet" not in page2.plan_reason.text()
        assert page2.layer_map.plan is not None
        assert "-c 1024" in page2.argv.edit.text() or "1024" in page2.argv.edit.text()
        chat2 = ChatPage(again)
        qtbot.addWidget(chat2)
        chat2.chat.open(conversation)
        qtbot.waitUntil(lambda: chat2.chat.current is not None, timeout=10_000)
        qtbot.waitUntil(lambda: "context" in chat2.status.text(), timeout=10_000)
        qtbot.waitUntil(lambda: "/ 1,024" in chat2.status.text(), timeout=10_000)
    finally:
        again.close()
        again.tasks.shutdown(timeout=10)
        again.setParent(None)
        again.deleteLater()
