"""What of a tool's conversation ``k3desk serve`` keeps and brings back (without an
engine: the keeper records what it is asked; the engine-backed journey is in
tests/core/engines/test_tool_conversations.py, and pictures against the engine in
tests/core/chat/test_kept_state.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k3desk.core.app.tool_conversations import ToolConversations, conversation_of
from k3desk.core.chat.kept_state import NOTHING_KEPT, Kept, StateKeeper, pictures_of
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


def test_a_conversations_pictures_are_known_by_their_data_in_the_prompts_order() -> None:
    """What a kept state's pictures are read from: each picture's data, in the order of the
    messages and their parts (tool results too); a picture sent as a link (the engine
    fetches it) or a part that is neither text nor picture makes it one not kept."""
    other = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,BBBB"}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Look"}, PICTURE]},
        {"role": "assistant", "content": "A cat."},
        {"role": "tool", "tool_call_id": "c1", "content": [other, other]},
        QUESTION,
    ]
    assert pictures_of(messages) == ("AAAA", "BBBB", "BBBB")
    assert pictures_of([QUESTION]) == ()
    link = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert pictures_of([*messages, {"role": "user", "content": [link]}]) is None
    sound = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    assert pictures_of([{"role": "user", "content": [sound]}]) is None


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
