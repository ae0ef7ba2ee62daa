"""The app at the real size: GrEarl's 94-part IQ1_S (528 GiB, a sparse twin) on a machine
with far less RAM, from My models to an answer, with the real llama-server.

The CLI's rehearsal is ``tests/e2e/test_real_size.py``; this is the same regime through the
window: the row says it streams from disk, Chat with it asks first (the cost in seconds per
token and load time), "Launch anyway" starts llama-server as planned for this machine
(``--no-repack``, mmap, no GPU flags), and a question gets a generated token back."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from k3desk.core.chat.history import HistoryStore
from k3desk.core.chat.model import ChatSettings
from k3desk.ui.pages import PageKey
from tests.ui.test_journeys import open_window, settle
from tests.ui.test_slow_launch import _answer

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(1800)]

ONE_TOKEN = ChatSettings(thinking=False, max_tokens=1, seed=1, extra_body={"ignore_eos": True})


def test_the_app_chats_with_the_94_part_twin_after_asking(  # type: ignore[no-untyped-def]
    ctx, qtbot, twin_factory, llama_server
) -> None:
    shard = twin_factory("grearl-iq1s")[0]
    ctx.update_settings(
        model_dirs=(str(shard.parent),), wizard_done=True, engine_binary=str(llama_server)
    )
    here = ctx.services.this_machine()
    if here.memory.total > 256 << 30:
        pytest.skip("this machine holds the model in RAM: not the regime under test")
    w = open_window(ctx, qtbot)
    w.show_page(PageKey.MODELS)
    mine = w.models_page().mine
    qtbot.waitUntil(lambda: len(mine.rows()) == 1, timeout=120_000)
    assert mine.shown_rows()[0]["verdict"].startswith("streams from disk")
    _answer("Launch anyway")
    qtbot.mouseClick(mine.chat_btn, Qt.MouseButton.LeftButton)
    engine = ctx.engine
    qtbot.waitUntil(lambda: engine.request is not None, timeout=120_000)
    args = engine.request.spec.args
    assert "--no-repack" in args
    assert "-ngl" not in args
    assert "--mlock" not in args
    qtbot.waitUntil(lambda: engine.ready, timeout=1_500_000)
    chat = w.chat_page()
    chat.chat.update_settings("", ONE_TOKEN)
    chat.composer.edit.setPlainText("Hi")
    qtbot.keyClick(chat.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: chat.chat.streaming or bool(chat.chat._task), timeout=10_000)
    qtbot.waitUntil(
        lambda: not chat.chat.streaming and chat.chat._task is None, timeout=1_500_000
    )
    assert ctx.reporter.last is None, ctx.reporter.last
    settle(ctx, qtbot, w)
    with HistoryStore(ctx.services.paths.history_db) as store:
        (conversation,) = store.list_conversations()
        _, messages = store.open_conversation(conversation.id)
    answer = messages[-1]
    assert answer.role == "assistant"
    assert answer.usage is not None
    assert answer.usage.prompt_tokens > 0  # the twin's template rendered the question
    assert answer.usage.completion_tokens == 1
