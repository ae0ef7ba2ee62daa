"""What of a tool's conversation ``k3desk serve`` keeps and brings back (without an
engine: the keeper records what it is asked; the engine-backed journey is in
tests/core/engines/test_tool_conversations.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k3desk.core.app.tool_conversations import ToolConversations, conversation_of
from k3desk.core.chat.kept_state import NOTHING_KEPT, Kept, StateKeeper
from k3desk.core.engines.front import Upstream

ENGINE = Upstream("127.0.0.1", 9, "k3-app", pid=1)
PICTURE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
QUESTION = {"role": "user", "content": "What is on it?"}


class _Keeper(StateKeeper):
    """A keeper that keeps nothing and records what it was asked to keep or bring back."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.asked: list[tuple[str, Any]] = []

    def keep_body(self, client: Any, conversation: str, body: Any, answer: Any) -> Kept:
        self.asked.append(("keep", answer))
        return Kept(False, NOTHING_KEPT)

    def bring_back_body(self, client: Any, conversation: str, body: Any) -> Kept:
        self.asked.append(("bring back", conversation))
        return Kept(False, NOTHING_KEPT)


@pytest.fixture
def keeper(tmp_path: Path) -> _Keeper:
    return _Keeper(tmp_path)


def test_a_conversation_with_a_picture_is_neither_kept_nor_brought_back(keeper: _Keeper) -> None:
    """The engine saves no picture's embeddings in a state (llama-server refuses to save
    a slot holding image chunks): it is read again, never restored short of its picture."""
    said: list[str] = []
    tools = ToolConversations(keeper, said.append)
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Look"}, PICTURE]}]}
    tools.resume(body, ENGINE)
    tools.answered(body, {"role": "assistant", "content": "A cat."}, ENGINE)
    assert keeper.asked == []
    text = {"messages": [QUESTION]}
    tools.resume(text, ENGINE)
    tools.answered(text, {"role": "assistant", "content": "Nothing."}, ENGINE)
    assert [a for a, _ in keeper.asked] == ["bring back", "keep"]
    assert said == []  # nothing kept, nothing said


def test_an_answer_the_request_began_itself_is_not_kept(keeper: _Keeper) -> None:
    """A request ending with the assistant's own words is continued, not answered anew: the
    next request holds one message where keeping would render two."""
    tools = ToolConversations(keeper, lambda _: None)
    began = {"messages": [QUESTION, {"role": "assistant", "content": "It is"}]}
    tools.answered(began, {"role": "assistant", "content": " a cat."}, ENGINE)
    assert keeper.asked == []


def test_a_conversation_is_known_by_its_beginning_whatever_follows() -> None:
    system = {"role": "system", "content": "Be brief."}
    first = {"messages": [system, QUESTION]}
    later = {"messages": [system, QUESTION, {"role": "assistant", "content": "A cat."},
                          {"role": "user", "content": "And?"}]}  # fmt: skip
    other = {"messages": [system, {"role": "user", "content": "Another question."}]}
    assert conversation_of(first) == conversation_of(later) != conversation_of(other)
