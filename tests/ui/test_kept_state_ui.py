"""The chat window says where an answer's prompt comes from after a restart: the
conversation's saved engine state, or read again with how many tokens and about how long
(the real llama-server, the tiny Kimi-K3; the numbers compared with the engine's own
timings of that answer)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from k3desk.core.chat.kept_state import states_dir
from k3desk.core.chat.model import ChatSettings, Timings
from k3desk.ui.chat.page import ChatPage
from tests.ui.test_chat import send, wait_idle

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SHORT = ChatSettings(thinking=False, max_tokens=4, seed=1, temperature=0.0)


def test_the_chat_says_resumed_or_re_reading_after_a_restart(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, tiny_k3_single
) -> None:
    from k3desk.core.engines.supervisor import LaunchSpec
    from k3desk.ui.engine.controller import LaunchRequest

    folder = states_dir(ctx.services.paths.cache)

    def restart() -> None:
        if ctx.engine.running:
            ctx.engine.stop()
            qtbot.waitUntil(lambda: not ctx.engine.running, timeout=30_000)
        args = ("-m", str(tiny_k3_single.first_part), "-c", "4096", "--jinja", "-np", "1")
        spec = LaunchSpec(llama_server, args, ready_timeout=60, state_dir=folder)
        ctx.engine.launch(LaunchRequest(spec, model_name=tiny_k3_single.name, vision=False))
        qtbot.waitUntil(lambda: ctx.engine.ready, timeout=60_000)

    def answer_timings() -> Timings:
        assert page.chat.current is not None
        last = page.chat.current.messages[-1]
        assert last.role == "assistant"
        assert last.timings is not None
        return last.timings

    restart()
    page = ChatPage(ctx)
    qtbot.addWidget(page)
    page.show()
    page.chat.update_settings("", SHORT)
    for question in ("Tell me a long story about a cat and a dog.", "And then?"):
        send(qtbot, page, question)
        wait_idle(qtbot, page)
    assert not page.composer.notice.isVisible()  # the engine held it: nothing to say

    def after_restart(question: str, said: str) -> tuple[int, Timings]:
        """Restart the engine, ask; the number the chat said (matching ``said``) and the
        engine's timings of the answer."""
        restart()
        send(qtbot, page, question)
        wait_idle(qtbot, page)
        text = page.composer.notice.text()
        m = re.match(said, text)
        assert m, text
        assert page.composer.notice.isVisible()
        return int(m.group(1).replace(",", "")), answer_timings()

    n, timings = after_restart(
        "What happened next?",
        r"Resumed from saved state \(([\d,]+) tokens, (?:under 0\.1|[\d.]+) s\)\.$",
    )
    assert n == timings.cache_n > 0
    send(qtbot, page, "Who won?")  # the engine holds it now: what was said goes
    wait_idle(qtbot, page)
    assert not page.composer.notice.isVisible()

    for f in Path(folder).glob("k3c-*.bin"):
        f.write_bytes(b"not a state")  # damaged: refused and deleted, then read again
    n, timings = after_restart(
        "And how did it end?",
        r"Re-reading ([\d,]+) tokens(?: \(about \d+ (?:s|min)\))?\. The kept state's file",
    )
    assert n == timings.prompt_n
    assert timings.cache_n == 0
    assert ctx.reporter.last is None
