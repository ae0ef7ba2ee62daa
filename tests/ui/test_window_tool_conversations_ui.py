"""A tool using the window's local API and the person's chat in the window, on one engine
slot (the real llama-server, the tiny Kimi-K3): each turn of one brings its conversation
back from its kept state after the other had the slot, and says so (the chat above the
composer, the tool's in the engine's log), with the engine's own timings as the oracle."""

from __future__ import annotations

import re

import pytest

from k3desk.core.app.local_api import create_key
from k3desk.core.chat.model import ChatSettings
from k3desk.core.engines.ports import free_port
from k3desk.ui.chat.page import ChatPage
from tests.core.app.test_window_tool_conversations import ToolTalk
from tests.ui.test_chat import send, wait_idle

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SHORT = ChatSettings(thinking=False, max_tokens=4, seed=1, temperature=0.0)


def test_a_tool_and_the_chat_take_turns_on_the_slot_and_each_comes_back(  # type: ignore[no-untyped-def]
    ctx, qtbot, monkeypatch, llama_server, tiny_k3_single
) -> None:
    from k3desk.core.engines.supervisor import LaunchSpec
    from k3desk.ui.engine.controller import LaunchRequest

    monkeypatch.delenv("K3DESK_API_PORT")
    port = free_port()
    ctx.update_settings(api_port=port)
    _, secret = create_key(ctx.services, "agent")
    log: list[str] = []
    ctx.engine.log_lines.connect(log.append)
    args = ("-m", str(tiny_k3_single.first_part), "-c", "4096", "--jinja", "-np", "1")
    ctx.engine.launch(LaunchRequest(LaunchSpec(llama_server, args, ready_timeout=60),
                                    model_name=tiny_k3_single.name, vision=False))  # fmt: skip
    qtbot.waitUntil(lambda: ctx.engine.ready, timeout=60_000)
    page = ChatPage(ctx)
    qtbot.addWidget(page)
    page.show()
    page.chat.update_settings("", SHORT)
    tool_asks = ToolTalk(port, secret, "Write a poem about the sea.", max_tokens=4).ask

    def said(pattern: str) -> int:
        """The tokens the engine's log says, on the line matching ``pattern``."""
        qtbot.waitUntil(lambda: bool(re.search(pattern, "".join(log))), timeout=10_000)
        return int(re.findall(pattern, "".join(log))[-1].replace(",", ""))

    send(qtbot, page, "Tell me a long story about a cat and a dog.")
    wait_idle(qtbot, page)
    tool_asks()
    # the person asks again at once: the tool's conversation is kept before the chat takes
    # the slot, and the chat's comes back from its state
    send(qtbot, page, "And then?")
    wait_idle(qtbot, page)
    assert said(r"A tool's conversation kept: ([\d,]+) tokens") > 0
    notice = page.composer.notice.text()
    m = re.match(r"Resumed from saved state \(([\d,]+) tokens", notice)
    assert m, notice
    assert page.chat.current is not None
    timings = page.chat.current.messages[-1].timings
    assert timings is not None
    assert timings.cache_n == int(m.group(1).replace(",", ""))
    # the tool comes back: its conversation from its state, said in the engine's log
    got = tool_asks("And the waves?")
    assert got["cache_n"] == said(r"A tool's conversation resumed from saved state \(([\d,]+)")
    # the window restarts its engine at once: the tool's last turn is kept before it stops
    # (not left to the idle keep, which would find the engine gone), and comes back whole
    log.clear()
    pid = ctx.engine.endpoint().pid
    ctx.engine.restart()
    qtbot.waitUntil(lambda: ctx.engine.ready and ctx.engine.endpoint().pid != pid, timeout=60_000)
    kept = said(r"A tool's conversation kept: ([\d,]+) tokens")
    got = tool_asks("And the storm?")
    assert got["cache_n"] == said(r"A tool's conversation resumed from saved state \(([\d,]+)")
    assert got["cache_n"] == kept
    assert ctx.reporter.last is None
    ctx.engine.stop()
    qtbot.waitUntil(lambda: not ctx.engine.running, timeout=30_000)
