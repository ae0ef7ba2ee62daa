"""Tools' conversations through the app window's local API, beside the window's own chat:
one engine slot, two users of it.  Each keeps its conversation's state before the other
takes the slot and brings it back after (core/app/local_api.AppFront and
core/app/chat_turn.ConversationStates, wired as the window wires them), and a tool's
conversation comes back from its state after the window restarts the engine.  The oracle
is the real llama-server b11434's own count of what it read (``timings``: ``prompt_n``
read, ``cache_n`` taken from its slot)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from k3desk.core.app.chat_turn import ConversationStates, TurnRecord, run_turn
from k3desk.core.app.local_api import PORT_ENV, AppFront, create_key, set_api_port
from k3desk.core.app.services import Services
from k3desk.core.chat.client import ChatClient, ChatEndpoint
from k3desk.core.chat.history import HistoryStore
from k3desk.core.chat.kept_state import ANY_SLOT, keeper_for
from k3desk.core.chat.model import ChatSettings
from k3desk.core.engines.ports import free_port
from k3desk.devtools.tinyk3 import TinyModel
from tests.fixtures.engine import BehindFront

pytestmark = [pytest.mark.engine]
SETTINGS = ChatSettings(thinking=False, max_tokens=4, seed=1, temperature=0.0)
OPTIONS = {"seed": 1, "temperature": 0.0, "chat_template_kwargs": {"thinking": False}}


class ToolTalk:
    """A tool's conversation through the local API at ``port`` with the key ``secret``, as
    the OpenAI SDK sends it: the whole conversation again with each next question."""

    def __init__(self, port: int, secret: str, first: str, max_tokens: int = 8) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        self.auth = {"Authorization": f"Bearer {secret}"}
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
        self.max_tokens = max_tokens

    def ask(self, question: str | None = None) -> dict[str, Any]:
        """Send it (with ``question`` last), keep the answer; the engine's timings."""
        if question is not None:
            self.messages.append({"role": "user", "content": question})
        body = {"messages": self.messages, "max_tokens": self.max_tokens, **OPTIONS}
        r = httpx.post(self.url, json=body, headers=self.auth, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()
        self.messages.append({"role": "assistant",
                              "content": got["choices"][0]["message"]["content"]})  # fmt: skip
        timings: dict[str, Any] = got["timings"]
        return timings


def resumed(said: list[str]) -> int:
    """The tokens of the state a tool's conversation was brought back from, as said; the
    engine must then take exactly these from its slot (its ``cache_n``) and read the rest."""
    found = [re.match(r"A tool's conversation resumed from saved state \(([\d,]+) tokens", line)
             for line in said]  # fmt: skip
    (n,) = [int(m.group(1).replace(",", "")) for m in found if m]
    assert n > 40  # the tool's first turn at least
    return n


def test_a_tools_conversation_and_the_windows_chat_share_the_slot_and_survive_a_restart(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PORT_ENV)
    services = Services()
    port = free_port()
    set_api_port(services, port)
    _, secret = create_key(services, "agent")
    said: list[str] = []
    front = AppFront(services, say=said.append)
    settings = services.settings()
    states = ConversationStates(keeper_for(services.paths.cache, settings.kept_state_gib))
    states.on_take = lambda: front.slot_taken()  # as the window's chat controller wires them
    front.on_tool_turn = states.slot_taken
    behind = BehindFront(services, front, llama_server)

    def launch() -> ChatClient:
        ep = behind.launch(tiny_k3_single.first_part, ctx=2048).endpoint
        assert ep is not None
        return ChatClient(ChatEndpoint(ep.url, ep.api_key, owner_pid=ep.pid))

    tool = ToolTalk(port, secret, "Tell me a long story about a cat and a dog.")
    tool_asks = tool.ask

    try:
        with HistoryStore(tmp_path / "history.sqlite3") as store:
            client = launch()
            tool_asks()
            # the window's chat takes the slot at once (before the tool's idle keep): the
            # tool's conversation is kept first
            record = TurnRecord.new_conversation(store, "Write a poem about the sea.",
                                                 settings=SETTINGS)  # fmt: skip
            assert states.before(client, record.conversation.id, record.request_messages(),
                                 SETTINGS) is None  # fmt: skip
            assert any(line.startswith("A tool's conversation kept") for line in said), said
            assert (
                run_turn(client, record.request_messages(), SETTINGS, record=record).error is None
            )
            assert states.after(client, record, SETTINGS).done  # type: ignore[union-attr]
            # the tool comes back: its state is restored, the engine reads only the question
            said.clear()
            timings = tool_asks("And then?")
            assert timings["cache_n"] == resumed(said), (timings, said)
            # the window's chat comes back: the tool took the slot, so its state is restored
            record = TurnRecord.ask(store, record.conversation.id, "And the moon?")
            back = states.before(client, record.conversation.id, record.request_messages(),
                                 SETTINGS)  # fmt: skip
            assert back is not None
            assert back.done, back.why
            outcome = run_turn(client, record.request_messages(), SETTINGS, record=record)
            assert outcome.result is not None
            assert outcome.result.timings is not None
            assert outcome.result.timings.cache_n == back.tokens
            client.close()
            # the window restarts its engine (a switch, a re-plan): the tool's conversation
            # answered last is kept before it stops, and comes back on the new engine
            tool_asks("Go on.")
            said.clear()
            front.flush()
            behind.running[-1].stop()
            launch().close()
            timings = tool_asks("And at the end?")
            assert timings["cache_n"] == resumed(said), (timings, said)
    finally:
        behind.close()


def slot_task(client: ChatClient, slot: int) -> int | None:
    """The last task the engine ran in ``slot`` (its ``/slots``; None: none yet)."""
    status, slots = client.call("GET", "/slots")
    assert status == 200
    task: int | None = slots[slot].get("id_task")
    return task


def test_the_windows_chat_is_kept_on_an_engine_answering_several_requests_at_once(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests at once (Settings' requests at once, --parallel 2): a tool's
    conversation through the local API goes on beside the window's chat.  The window's
    turns go to the engine's slot 0, so its conversation is still kept there, comes back
    after the tool's turns and after an engine restart, and the engine then reads only
    the new question (its own ``cache_n``).  A tool's conversation is not kept here: the
    engine puts a tool's request in whichever slot it likes."""
    monkeypatch.delenv(PORT_ENV)
    services = Services()
    services.settings_store.save(replace(services.settings(), api_parallel=2))
    port = free_port()
    set_api_port(services, port)
    _, secret = create_key(services, "agent")
    said: list[str] = []
    front = AppFront(services, say=said.append)
    states = ConversationStates(
        keeper_for(services.paths.cache, services.settings().kept_state_gib)
    )
    states.on_take = lambda: front.slot_taken()
    front.on_tool_turn = states.slot_taken
    behind = BehindFront(services, front, llama_server)

    def launch() -> ChatClient:
        ep = behind.launch(tiny_k3_single.first_part, ctx=4096, parallel=2).endpoint
        assert ep is not None
        return ChatClient(ChatEndpoint(ep.url, ep.api_key, owner_pid=ep.pid))

    def window_turn(client: ChatClient, record: TurnRecord) -> tuple[Any, Any]:
        back = states.before(client, record.conversation.id, record.request_messages(),
                             SETTINGS)  # fmt: skip
        before = slot_task(client, 0)
        outcome = run_turn(client, record.request_messages(), SETTINGS, record=record)
        assert outcome.result is not None
        assert outcome.result.timings is not None
        # the engine's own account: the turn was answered in slot 0 (left to choose, a
        # fresh engine puts it in its last slot, and keeping it reads it all again)
        assert slot_task(client, 0) not in (None, before)
        kept = states.after(client, record, SETTINGS)
        assert kept is not None
        assert kept.done, kept
        return back, outcome.result.timings

    tool = ToolTalk(port, secret, "Tell me a long story about a cat and a dog.")
    try:
        with HistoryStore(tmp_path / "history.sqlite3") as store:
            client = launch()
            assert client.call("GET", "/props")[1]["total_slots"] == 2
            record = TurnRecord.new_conversation(store, "Write a poem about the sea.",
                                                 settings=SETTINGS)  # fmt: skip
            window_turn(client, record)
            tool.ask()
            tool.ask("And then?")
            # the tool may have been in slot 0: the window's state comes back from its file
            record = TurnRecord.ask(store, record.conversation.id, "And the moon?")
            back, timings = window_turn(client, record)
            assert back is not None
            assert back.done, back
            assert timings.cache_n == back.tokens
            # a tool's conversation is neither kept nor restored in slot 0 here: its
            # requests go wherever the engine puts them
            tool_body = {"messages": tool.messages[:-1]}
            got = states.keeper.keep_body(client, "tool-x", tool_body, tool.messages[-1])
            assert not got.done
            assert got.why == f"Not kept: {ANY_SLOT}."
            got = states.keeper.bring_back_body(client, str(record.conversation.id), tool_body)
            assert not got.done
            assert got.why == f"The kept state is not used: {ANY_SLOT}."
            client.close()
            behind.running[-1].stop()
            client = launch()  # restarted: the window's conversation comes back from its state
            record = TurnRecord.ask(store, record.conversation.id, "And the stars?")
            back, timings = window_turn(client, record)
            assert back is not None
            assert back.done, back
            assert timings.cache_n == back.tokens > 40
            client.close()
        assert not any("tool's conversation" in line for line in said), said
    finally:
        behind.close()
