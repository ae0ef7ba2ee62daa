"""Tools' conversations through ``k3desk serve``'s front, kept in the engine's state.

A tool (a coding agent, a script) continues a conversation by sending it again, whole,
with the next question.  After an engine restart that costs a read of all of it; the chat
window avoids it with the conversation's kept state (:mod:`k3desk.core.chat.kept_state`),
and the front (:mod:`k3desk.core.engines.front`) gives tools the same: when the engine has
been idle a few seconds after an answer, before another conversation takes its one slot,
and before ``k3desk serve`` stops it, the state of that conversation (as its next
question's prompt will begin) is saved; before a request whose conversation the slot does
not hold (the first after a restart, or a switch), the longest kept state that request's
prompt begins with is restored.

A tool's conversation is known by what it begins with (its messages up to its first
question): the states of one conversation replace each other's oldest, as the chat's do.
What it is checked against is the chat's: the engine, model files, projector, context and
cache types, and the prompt itself (rendered by the engine's own template with the tools
and template options the request gives), so a state is restored only where the engine
then reads just the rest.  An answer that calls tools is kept up to where its first
call's result will begin, and as the tool will send it back (the front says how:
:func:`k3desk.core.engines.front.sent_back`).  Anthropic Messages conversations are kept
as the engine turns them into Chat Completions ones, and OpenAI Responses ones likewise.
Pictures sent as data are kept with the state and known by their bytes.  Not kept: a
picture sent as a link (the engine fetches it), an answer the request began itself (its
last message the assistant's), engines answering several requests at once (the engine
puts a tool's request in whichever slot it likes; the chat window's turns, pinned to slot
0, are kept there all the same).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

from k3desk.core.chat.client import ChatClient, ChatEndpoint
from k3desk.core.chat.kept_state import NOTHING_KEPT, StateKeeper, keeper_for
from k3desk.core.engines.front import Upstream
from k3desk.core.errors import K3Error
from k3desk.core.settings import Settings
from k3desk.core.units import fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

__all__ = ["ToolConversations", "conversation_of", "tool_conversations"]


def conversation_of(body: dict[str, Any]) -> str:
    """A tool's conversation, by its messages up to and including its first question."""
    messages = body.get("messages") or []
    first = next((i for i, m in enumerate(messages) if isinstance(m, dict)
                  and m.get("role") == "user"), len(messages) - 1)  # fmt: skip
    start = json.dumps(messages[: first + 1], sort_keys=True, ensure_ascii=False)
    return "tool-" + hashlib.sha256(start.encode()).hexdigest()[:16]


class ToolConversations:
    """:class:`k3desk.core.engines.front.Conversations` over a :class:`StateKeeper`;
    ``say`` gets one line for each state kept or brought back."""

    def __init__(self, keeper: StateKeeper, say: Callable[[str], None]) -> None:
        self.keeper = keeper
        self.say = say

    def conversation(self, body: dict[str, Any]) -> str:
        return conversation_of(body)

    def _client(self, engine: Upstream) -> ChatClient:
        url = f"http://{engine.host}:{engine.port}"
        return ChatClient(ChatEndpoint(url, engine.api_key, owner_pid=engine.pid or None))

    def resume(self, body: dict[str, Any], engine: Upstream) -> None:
        try:
            with self._client(engine) as client:
                got = self.keeper.bring_back_body(client, conversation_of(body), body)
        except (K3Error, httpx.HTTPError, OSError) as e:
            self.say(f"A tool's conversation is read again: {e}")
            return
        if got.done:
            self.say(
                f"A tool's conversation resumed from saved state ({got.tokens:,} tokens, "
                f"{got.seconds:.1f} s)."
            )
        elif got.why != NOTHING_KEPT:
            self.say(f"A tool's conversation is read again. {got.why}")

    def answered(self, body: dict[str, Any], answer: dict[str, Any], engine: Upstream) -> None:
        messages = body.get("messages") or []
        if messages and _role(messages[-1]) == "assistant":
            return
        try:
            with self._client(engine) as client:
                got = self.keeper.keep_body(client, conversation_of(body), body, answer)
        except (K3Error, httpx.HTTPError, OSError) as e:
            self.say(f"A tool's conversation was not kept: {e}")
            return
        if got.done:
            self.say(f"A tool's conversation kept: {got.tokens:,} tokens ({fmt_bytes(got.size)}).")


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def tool_conversations(
    services: Services, settings: Settings, parallel: int, say: Callable[[str], None]
) -> ToolConversations | None:
    """What keeps tools' conversations for ``k3desk serve``'s front; None where none is
    kept (Settings keeps no states, or the engine answers several requests at once)."""
    if settings.kept_state_gib <= 0 or parallel != 1:
        return None
    return ToolConversations(keeper_for(services.paths.cache, settings.kept_state_gib), say)
