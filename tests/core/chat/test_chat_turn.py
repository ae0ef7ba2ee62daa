"""The one chat turn the window and ``k3desk chat --save`` run: the history holds the
question before the request, the answer while it streams, and how it ended."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3desk.core.app.chat_turn import NOTE_BROKEN, NOTE_STOPPED, TurnRecord, run_turn, title_for
from k3desk.core.chat.client import ChatClient, ChatDelta, ChatEndpoint
from k3desk.core.chat.history import HistoryStore
from k3desk.core.chat.model import ChatSettings
from k3desk.core.errors import ChatError
from k3desk.core.progress import CancelToken
from tests.core.chat.conftest import StandIn


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HistoryStore]:
    s = HistoryStore(tmp_path / "history.db")
    yield s
    s.close()


def reader(store: HistoryStore) -> HistoryStore:
    """A second connection, as another process would read the history."""
    return HistoryStore(store.path)


def client_for(st: StandIn) -> ChatClient:
    return ChatClient(ChatEndpoint(st.url))


def test_a_turn_keeps_the_question_first_then_the_answer_as_it_streams(
    standin: StandIn, store: HistoryStore
) -> None:
    standin.gate = threading.Event()
    standin.tokens = [("reasoning", "Hmm."), ("content", "Hello"), ("content", " world")]
    record = TurnRecord.new_conversation(
        store, "Say hello\nplease", system_prompt="Be brief.", settings=ChatSettings(seed=3)
    )
    record.save_every = 0.0  # every delta is written through
    # the question is committed before anything is sent
    with reader(store) as other:
        (conv,) = other.list_conversations()
        assert conv.title == "Say hello"
        assert [(m.role, m.content) for m in other.branch(conv.id)] == [
            ("user", "Say hello\nplease")
        ]
    seen: list[tuple[str, str, bool]] = []

    def on_delta(d: ChatDelta) -> None:
        # what another process reads of the answer while it streams
        with reader(store) as other:
            ans = other.branch(conv.id)[-1]
            seen.append((ans.role, ans.content, ans.partial))
        standin.gate.set()  # type: ignore[union-attr]

    with client_for(standin) as client:
        outcome = run_turn(
            client,
            record.request_messages(),
            record.conversation.settings,
            on_delta=on_delta,
            record=record,
        )
    assert seen == [
        ("assistant", "", True),
        ("assistant", "Hello", True),
        ("assistant", "Hello world", True),
    ]
    assert outcome.error is None
    assert outcome.answer is not None
    assert (outcome.answer.content, outcome.answer.reasoning) == ("Hello world", "Hmm.")
    assert not outcome.answer.partial
    assert outcome.answer.finish_reason == "stop"
    assert outcome.n_ctx == 4096  # the stand-in's /props
    # what went out: the system prompt, then the question, with the conversation's seed
    body = standin.requests[-1]
    assert [(m["role"], m["content"]) for m in body["messages"]] == [
        ("system", "Be brief."),
        ("user", "Say hello\nplease"),
    ]
    assert body["seed"] == 3


def test_a_stopped_answer_is_kept_marked_stopped(standin: StandIn, store: HistoryStore) -> None:
    standin.gate = threading.Event()
    standin.tokens = [("content", f"w{i} ") for i in range(6)]
    record = TurnRecord.new_conversation(store, "Count")
    cancel = CancelToken()
    got: list[str] = []

    def on_delta(d: ChatDelta) -> None:
        got.append(d.text)
        if len(got) == 2:
            cancel.cancel()
        standin.gate.set()  # type: ignore[union-attr]

    with client_for(standin) as client:
        outcome = run_turn(
            client, record.request_messages(), cancel=cancel, on_delta=on_delta, record=record
        )
    assert outcome.answer is not None
    assert outcome.answer.partial
    assert outcome.answer.finish_reason == NOTE_STOPPED
    assert outcome.answer.content == "".join(got) == "w0 w1 "


def test_a_broken_stream_keeps_what_arrived_marked_interrupted(
    standin: StandIn, store: HistoryStore
) -> None:
    standin.tokens = [("content", "one "), ("content", "two "), ("content", "three ")]
    standin.cut_after = 2
    record = TurnRecord.new_conversation(store, "Go")
    with client_for(standin) as client:
        outcome = run_turn(client, record.request_messages(), record=record)
    assert outcome.error is not None
    assert outcome.answer is not None
    assert outcome.answer.partial
    assert outcome.answer.finish_reason == NOTE_BROKEN
    assert outcome.answer.content == "one two "


def test_a_refused_request_raises_and_leaves_the_question_with_an_empty_broken_answer(
    standin: StandIn, store: HistoryStore
) -> None:
    standin.status = 500
    standin.error_body = {"error": {"code": 500, "message": "boom", "type": "server_error"}}
    record = TurnRecord.new_conversation(store, "Go")
    with client_for(standin) as client, pytest.raises(ChatError):
        run_turn(client, record.request_messages(), record=record)
    msgs = store.branch(record.conversation.id)
    assert [(m.role, m.content, m.partial, m.finish_reason) for m in msgs] == [
        ("user", "Go", False, None),
        ("assistant", "", True, NOTE_BROKEN),
    ]


def test_an_interrupted_turn_is_recorded_before_the_interrupt_goes_on(
    standin: StandIn, store: HistoryStore
) -> None:
    standin.tokens = [("content", "a"), ("content", "b"), ("content", "c")]
    record = TurnRecord.new_conversation(store, "Go")

    def on_delta(d: ChatDelta) -> None:
        if d.text == "b":
            raise KeyboardInterrupt

    with client_for(standin) as client, pytest.raises(KeyboardInterrupt):
        run_turn(client, record.request_messages(), on_delta=on_delta, record=record)
    answer = store.branch(record.conversation.id)[-1]
    assert (answer.content, answer.partial, answer.finish_reason) == ("ab", True, NOTE_BROKEN)


def test_regenerate_and_edit_answer_the_same_question_on_new_branches(
    standin: StandIn, store: HistoryStore
) -> None:
    with client_for(standin) as client:
        first = TurnRecord.new_conversation(store, "Hi")
        run_turn(client, first.request_messages(), record=first)
        assert first.answer is not None
        again = TurnRecord.again(store, first.answer.id)
        assert again.question.id == first.question.id
        run_turn(client, again.request_messages(), record=again)
        assert again.answer is not None
        assert len(store.siblings(again.answer.id)) == 2  # both answers kept
        edited = TurnRecord.edited(store, first.question.id, "Hello?")
        run_turn(client, edited.request_messages(), record=edited)
    assert standin.requests[-1]["messages"][-1]["content"] == "Hello?"
    assert [m.content for m in store.branch(first.conversation.id)] == ["Hello?", "Hello world"]


def test_titles_are_the_first_line_of_the_question() -> None:
    assert title_for("  Write   a poem\nabout the sea") == "Write a poem"
    assert title_for("\n\n") == "Image"
    assert len(title_for("x" * 500)) == 60
