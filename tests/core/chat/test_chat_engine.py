"""The chat client against the real llama-server serving the tiny kimi-k3 (with vision)."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from k3desk.core.chat.client import (
    AuthError,
    ChatClient,
    ChatDelta,
    ChatEndpoint,
    ChatMessage,
    ChatStreamError,
    ContextOverflowError,
    EngineUnavailableError,
)
from k3desk.core.chat.images import ImageError, prepare_image
from k3desk.core.chat.model import ChatSettings
from k3desk.core.progress import CancelToken
from k3desk.devtools.tinyk3 import TinyModel
from tests.core.chat.conftest import RealServer, start_real_server

pytestmark = pytest.mark.engine

# random weights may end early; ignore_eos makes every answer exactly max_tokens long
LONG = {"ignore_eos": True}


def client(server: RealServer) -> ChatClient:
    return ChatClient(ChatEndpoint(server.url, server.api_key))


def red_png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def test_capabilities_of_the_real_server(k3_server: RealServer) -> None:
    with client(k3_server) as c:
        caps = c.capabilities()
    assert caps.source == "props"
    assert caps.vision is True
    assert caps.n_ctx == 4096


def test_thinking_goes_to_reasoning_and_can_be_switched_off(k3_server: RealServer) -> None:
    s = ChatSettings(max_tokens=24, seed=1, extra_body=LONG)
    with client(k3_server) as c:
        thinking = c.chat([ChatMessage("user", "Hello")], s)
        plain = c.chat(
            [ChatMessage("user", "Hello")],
            ChatSettings(max_tokens=24, seed=1, thinking=False, extra_body=LONG),
        )
    assert thinking.reasoning
    assert thinking.text == ""  # all 24 tokens went to the thinking channel
    assert plain.text
    assert plain.reasoning == ""
    for r in (thinking, plain):
        assert r.usage is not None
        assert r.usage.completion_tokens == 24
        assert r.timings is not None
        assert r.timings.predicted_n == 24
        assert r.timings.predicted_per_second > 0
        assert not r.partial


def test_an_image_is_encoded_into_the_prompt(k3_server: RealServer) -> None:
    img = prepare_image(red_png(), name="red.png")
    s = ChatSettings(max_tokens=4, seed=1, thinking=False)
    with client(k3_server) as c:
        without = c.chat([ChatMessage("user", "What colour is this?")], s)
        with_img = c.chat([ChatMessage("user", "What colour is this?", (img,))], s)
    assert without.usage is not None
    assert with_img.usage is not None
    # the tiny projector turns any image into (32/8)^2 = 16 embeddings
    assert with_img.usage.prompt_tokens - without.usage.prompt_tokens == 16


def test_images_are_refused_up_front_by_an_engine_without_projector(
    llama_server: Path, tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    server = start_real_server(llama_server, tiny_k3_single, tmp_path)
    try:
        img = prepare_image(red_png(), name="red.png")
        with client(server) as c, pytest.raises(ImageError) as err:
            c.chat([ChatMessage("user", "What is it?", (img,))])
        assert "has no vision" in err.value.message
        assert server.tokens_predicted() == 0  # nothing was sent to generate
    finally:
        server.kill()


def test_cancel_mid_stream_stops_generation(k3_server: RealServer) -> None:
    token = CancelToken()
    deltas = 0

    def on_delta(d: ChatDelta) -> None:
        nonlocal deltas
        deltas += 1
        if deltas == 10:
            threading.Thread(target=token.cancel).start()

    before = k3_server.tokens_predicted()
    with client(k3_server) as c:
        result = c.chat(
            [ChatMessage("user", "Tell me everything")],
            ChatSettings(max_tokens=3000, seed=2, extra_body=LONG),
            on_delta=on_delta,
            cancel=token,
        )
    assert result.cancelled
    assert result.partial
    assert result.reasoning or result.text
    # the slot is released at once and the token counter stops moving
    assert k3_server.wait_idle(timeout=5.0) < 2.0
    after = k3_server.tokens_predicted()
    time.sleep(0.5)
    assert k3_server.tokens_predicted() == after
    assert after - before < 3000


def test_engine_killed_mid_stream_keeps_the_partial_answer(k3_server_own: RealServer) -> None:
    got: list[str] = []

    def on_delta(d: ChatDelta) -> None:
        got.append(d.text)
        if len(got) == 10:
            os.kill(k3_server_own.proc.pid, signal.SIGKILL)

    with client(k3_server_own) as c, pytest.raises(ChatStreamError) as err:
        c.chat(
            [ChatMessage("user", "Tell me everything")],
            ChatSettings(max_tokens=3000, seed=3, extra_body=LONG),
            on_delta=on_delta,
        )
    result = err.value.result
    assert result.partial
    assert not result.cancelled
    assert len(got) >= 10
    assert result.reasoning + result.text == "".join(got)
    assert k3_server_own.url in err.value.message
    assert "stopped in the middle of the answer" in err.value.message
    assert "crashed" in err.value.hint
    # and the next request says the engine is gone, plainly
    k3_server_own.proc.wait(10)
    with (
        client(k3_server_own) as c,
        pytest.raises(EngineUnavailableError, match="connection refused"),
    ):
        c.chat([ChatMessage("user", "still there?")])


def test_context_overflow_from_the_real_engine(k3_server: RealServer) -> None:
    long_prompt = " ".join(f"word{i}" for i in range(6000))
    with client(k3_server) as c, pytest.raises(ContextOverflowError) as err:
        c.chat([ChatMessage("user", long_prompt)], ChatSettings(max_tokens=4))
    assert err.value.n_ctx == 4096
    assert err.value.n_prompt is not None
    assert err.value.n_prompt > 4096
    assert "too long for the engine's context window" in err.value.message


def test_wrong_key_against_the_real_engine(k3_server: RealServer) -> None:
    with ChatClient(ChatEndpoint(k3_server.url, "not-the-key")) as c, pytest.raises(AuthError):
        c.chat([ChatMessage("user", "Hello")])
