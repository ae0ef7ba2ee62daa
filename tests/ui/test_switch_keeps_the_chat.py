"""A conversation holding a picture, continued on a model without vision ("Load and
continue"): every later question is answered, the picture stays in the conversation, and
the chat says once that it is not sent (the real llama-server, the tiny Kimi-K3 with and
without its projector)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from k3desk.core.chat.model import ChatSettings
from k3desk.ui.chat.page import ChatPage
from tests.ui.test_chat import send, wait_idle

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SHORT = ChatSettings(thinking=False, max_tokens=4, seed=1, extra_body={"ignore_eos": True})


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 30, 200)).save(buf, format="PNG")
    return buf.getvalue()


def test_a_picture_is_kept_but_not_sent_to_a_model_without_vision(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, tiny_k3, tiny_k3_single
) -> None:
    from k3desk.core.engines.supervisor import LaunchSpec
    from k3desk.ui.engine.controller import LaunchRequest

    def launch(model, vision: bool, continue_chat: bool = False) -> None:  # type: ignore[no-untyped-def]
        args = ["-m", str(model.first_part), "-c", "4096", "--jinja", "-ngl", "0"]
        if vision:
            args += ["--mmproj", str(model.mmproj)]
        spec = LaunchSpec(llama_server, tuple(args), ready_timeout=60)
        request = LaunchRequest(
            spec,
            model_name=model.name,
            vision=vision,
            shard=model.first_part,
            continue_chat=continue_chat,
        )
        ctx.engine.launch(request)
        qtbot.waitUntil(lambda: ctx.engine.ready, timeout=60_000)

    launch(tiny_k3, vision=True)
    page = ChatPage(ctx)
    qtbot.addWidget(page)
    page.show()
    page.chat.update_settings("", SHORT)
    page.chat.prepare_bytes(png(), "blue.png")
    qtbot.waitUntil(lambda: len(page.composer.attachments) == 1, timeout=30_000)
    send(qtbot, page, "What colour is this?")
    wait_idle(qtbot, page)
    conversation = page.chat.current.conversation.id
    assert ctx.reporter.last is None

    launch(tiny_k3_single, vision=False, continue_chat=True)  # "Load and continue"
    assert page.chat.current.conversation.id == conversation
    send(qtbot, page, "And in words?")
    wait_idle(qtbot, page)
    assert ctx.reporter.last is None, ctx.reporter.last
    answers = [m for m in page.chat.current.messages if m.role == "assistant"]
    assert len(answers) == 2
    assert answers[-1].content
    assert not answers[-1].partial
    said = "This model has no vision: 1 picture in this conversation is not sent to it."
    assert page.composer.notice.text() == said
    assert not page.composer.notice.isHidden()

    # said once: the next question is answered without saying it again
    send(qtbot, page, "Once more?")
    wait_idle(qtbot, page)
    assert ctx.reporter.last is None
    assert page.composer.notice.isHidden() or page.composer.notice.text() != said
    messages = page.chat.current.messages
    assert len(messages) == 6
    assert len(messages[0].images) == 1  # the picture is kept in the conversation
    ctx.engine.close()
