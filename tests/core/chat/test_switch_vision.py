"""Switching models never makes a conversation unusable: a conversation that holds a
picture, continued on a model without vision (the real llama-server on the tiny Kimi-K3
started without its projector), keeps the picture in its history but does not send it,
and says so; on a model with vision the picture goes with the conversation again."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from k3desk.core.app.chat_turn import TurnRecord, run_turn, withheld_text
from k3desk.core.chat.client import ChatClient, ChatEndpoint
from k3desk.core.chat.history import HistoryStore
from k3desk.core.chat.images import ImageError, prepare_image
from k3desk.core.chat.model import ChatSettings
from k3desk.devtools.tinyk3 import TinyModel
from tests.core.chat.conftest import RealServer, start_real_server

pytestmark = pytest.mark.engine

SHORT = ChatSettings(max_tokens=4, seed=1, thinking=False, extra_body={"ignore_eos": True})


def picture() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 30, 200)).save(buf, format="PNG")
    return buf.getvalue()


def client(server: RealServer) -> ChatClient:
    return ChatClient(ChatEndpoint(server.url, server.api_key))


def turn(store: HistoryStore, server: RealServer, record: TurnRecord):  # type: ignore[no-untyped-def]
    with client(server) as c:
        return run_turn(c, record.request_messages(), SHORT, record=record)


def test_a_conversation_with_a_picture_goes_on_on_a_model_without_vision(
    llama_server: Path, tiny_k3: TinyModel, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    store = HistoryStore(tmp_path / "history.db")
    img = prepare_image(picture(), name="blue.png")
    seeing = start_real_server(llama_server, tiny_k3, tmp_path / "seeing")
    try:
        first = TurnRecord.new_conversation(store, "What colour is this?", images=(img,))
        outcome = turn(store, seeing, first)
        assert outcome.error is None
        assert outcome.withheld == 0
    finally:
        seeing.kill()
    conv = first.conversation.id

    # "Load and continue" a model without vision: every later question is answered
    blind = start_real_server(llama_server, tiny_k3_single, tmp_path / "blind")
    try:
        for question in ("And now in words?", "Once more?"):
            outcome = turn(store, blind, TurnRecord.ask(store, conv, question))
            assert outcome.error is None, outcome.error
            assert outcome.result is not None
            assert outcome.result.text
            assert outcome.withheld == 1
        assert blind.tokens_predicted() == 8
        # a new picture asked about here is refused by name, before anything is sent
        with pytest.raises(ImageError, match="has no vision"):
            turn(store, blind, TurnRecord.ask(store, conv, "And this one?", images=(img,)))
    finally:
        blind.kill()
    # the picture is kept in the history
    _conv, messages = store.open_conversation(conv)
    assert [len(m.images) for m in messages][:1] == [1]
    assert messages[0].images[0].path.is_file()
    assert withheld_text(1) == (
        "This model has no vision: 1 picture in this conversation is not sent to it."
    )

    # back on a model with vision, the picture goes with the conversation again
    seeing = start_real_server(llama_server, tiny_k3, tmp_path / "seeing-again")
    try:
        record = TurnRecord.ask(store, conv, "And the colour again?")
        with client(seeing) as c:
            sent = record.request_messages()
            assert sum(len(m.images) for m in sent) == 2  # the refused one stays in history
            outcome = run_turn(c, sent, SHORT, record=record)
        assert outcome.error is None
        assert outcome.withheld == 0
    finally:
        seeing.kill()
    store.close()
