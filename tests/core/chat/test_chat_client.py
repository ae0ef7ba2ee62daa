"""The chat client against a stand-in that streams the way llama-server does."""

from __future__ import annotations

import threading
import time

import pytest

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
from k3desk.core.errors import ChatError
from k3desk.core.progress import CancelToken
from tests.core.chat.conftest import StandIn

HELLO = [ChatMessage("user", "Hello")]

# a 1x1 PNG
# one red RGBA pixel (a PNG that decodes: images are checked before they are sent)
PNG_1x1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4"
    "890000000d49444154789c63f8cfc0f01f00050001ff89993d1d0000000049454e44ae426082"
)


def client_for(st: StandIn, key: str | None = None) -> ChatClient:
    return ChatClient(ChatEndpoint(st.url, api_key=key))


def test_streams_reasoning_and_content_apart_with_usage_and_timings(standin: StandIn) -> None:
    seen: list[ChatDelta] = []
    with client_for(standin) as c:
        result = c.chat(HELLO, on_delta=seen.append)
    assert [(d.kind, d.text) for d in seen] == [
        ("reasoning", "Let me think."),
        ("content", "Hello"),
        ("content", " world"),
    ]
    assert result.text == "Hello world"
    assert result.reasoning == "Let me think."
    assert result.finish_reason == "stop"
    assert not result.partial
    assert not result.cancelled
    assert result.usage is not None
    assert result.usage.prompt_tokens == 12
    assert result.usage.completion_tokens == 3
    assert result.timings is not None
    assert (result.timings.prompt_n, result.timings.predicted_n) == (12, 3)
    assert result.timings.predicted_per_second == pytest.approx(300.0)


def test_deltas_are_delivered_as_they_arrive_not_at_the_end(standin: StandIn) -> None:
    # the server sends the next token only after the client has seen the previous one
    standin.gate = threading.Event()
    standin.tokens = [("content", f"t{i} ") for i in range(5)]
    got: list[str] = []
    with client_for(standin) as c, c.stream(HELLO) as st:
        for d in st:
            got.append(d.text)
            standin.gate.set()
    # the server never had to wait for the client to see a token it had sent
    assert standin.gate_timeouts == 0
    assert "".join(got) == "t0 t1 t2 t3 t4 "
    assert st.result is not None
    assert st.result.text == "t0 t1 t2 t3 t4 "


def test_request_carries_card_defaults_and_thinking_switch(standin: StandIn) -> None:
    with client_for(standin) as c:
        c.chat(HELLO)
        c.chat(
            HELLO, ChatSettings(thinking=False, temperature=0.6, top_p=0.8, max_tokens=32, seed=7)
        )
        c.chat(HELLO, ChatSettings(thinking_effort="low"))
    first, second, third = standin.requests
    assert first["stream"] is True
    assert (first["temperature"], first["top_p"]) == (1.0, 0.95)
    assert first["chat_template_kwargs"] == {"thinking": True}
    assert first["messages"] == [{"role": "user", "content": "Hello"}]
    assert "max_tokens" not in first
    assert second["chat_template_kwargs"] == {"thinking": False}
    assert (second["temperature"], second["top_p"], second["max_tokens"], second["seed"]) == (
        0.6,
        0.8,
        32,
        7,
    )
    assert third["chat_template_kwargs"] == {"thinking": True, "thinking_effort": "low"}


def test_unknown_thinking_effort_is_refused_before_sending(standin: StandIn) -> None:
    with client_for(standin) as c, pytest.raises(ChatError, match="thinking effort 'medium'"):
        c.chat(HELLO, ChatSettings(thinking_effort="medium"))
    assert standin.requests == []


def test_sse_pings_and_missing_done_are_tolerated(standin: StandIn) -> None:
    standin.pings = True
    standin.send_done = False  # some servers end after the finish chunk
    with client_for(standin) as c:
        result = c.chat(HELLO)
    assert result.text == "Hello world"
    assert not result.partial


def test_capabilities_from_props(standin: StandIn) -> None:
    with client_for(standin) as c:
        caps = c.capabilities()
    assert caps.source == "props"
    assert caps.vision is True
    assert caps.n_ctx == 4096
    assert caps.model == "Tiny-K3-IQ1_S-00001-of-00003.gguf"


def test_capabilities_fall_back_to_models_and_model_id_is_sent(standin: StandIn) -> None:
    # a vLLM-like server: no /props; /v1/models names the model, which it requires
    standin.props = None
    standin.models = {"object": "list", "data": [{"id": "kimi-k3-neuron", "max_model_len": 32768}]}
    with ChatClient(ChatEndpoint(standin.url + "/v1/")) as c:
        caps = c.capabilities()
        c.chat(HELLO)
    assert (caps.source, caps.model, caps.n_ctx, caps.vision) == (
        "models",
        "kimi-k3-neuron",
        32768,
        None,
    )
    assert standin.requests[0]["model"] == "kimi-k3-neuron"


def test_api_key_is_sent_and_a_wrong_one_is_explained(standin: StandIn) -> None:
    standin.api_key = "right"
    with client_for(standin, "right") as c:
        assert c.chat(HELLO).text == "Hello world"
    assert standin.auth_headers[-1] == "Bearer right"
    with client_for(standin, "wrong") as c, pytest.raises(AuthError) as err:
        c.chat(HELLO)
    assert "refused the API key" in err.value.message
    assert "401" in err.value.message
    assert standin.url in err.value.message
    with client_for(standin) as c, pytest.raises(AuthError) as err2:
        c.chat(HELLO)
    assert "needs an API key" in err2.value.message


def test_context_overflow_is_explained_with_numbers(standin: StandIn) -> None:
    standin.status = 400
    standin.error_body = {
        "error": {
            "code": 400,
            "message": "request (5000 tokens) exceeds the available context size (4096 tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
        }
    }
    with client_for(standin) as c, pytest.raises(ContextOverflowError) as err:
        c.chat(HELLO)
    assert (err.value.n_prompt, err.value.n_ctx) == (5000, 4096)
    assert "too long for the engine's context window (5000 tokens, the context holds 4096)" in str(
        err.value
    )
    assert "larger context" in err.value.hint


def test_openai_style_context_overflow_is_recognised(standin: StandIn) -> None:
    standin.status = 400
    standin.error_body = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens. However, you "
            "requested 9000 tokens.",
            "type": "invalid_request_error",
        }
    }
    with client_for(standin) as c, pytest.raises(ContextOverflowError) as err:
        c.chat(HELLO)
    assert (err.value.n_prompt, err.value.n_ctx) == (9000, 8192)


HTTP_ERRORS = [
    (500, {"error": {"code": 500, "message": "boom"}}, ChatError, "failed (HTTP 500: boom)"),
    (
        503,
        {"error": {"message": "Loading model"}},
        EngineUnavailableError,
        "still loading the model",
    ),
    (404, {"detail": "Not Found"}, ChatError, "has no /v1/chat/completions"),
    (400, {"error": {"message": "bad sampler"}}, ChatError, "rejected the request (HTTP 400: bad"),
]


@pytest.mark.parametrize(("status", "body", "kind", "text"), HTTP_ERRORS)
def test_http_errors_become_plain_messages(
    standin: StandIn, status: int, body: object, kind: type[ChatError], text: str
) -> None:
    standin.status = status
    standin.error_body = body
    with client_for(standin) as c, pytest.raises(kind) as err:
        c.chat(HELLO)
    assert text in err.value.message
    assert "Traceback" not in str(err.value)


def test_connection_refused_says_engine_may_be_restarting(closed_port: int) -> None:
    with ChatClient(ChatEndpoint(f"http://127.0.0.1:{closed_port}")) as c:
        with pytest.raises(EngineUnavailableError) as err:
            c.chat(HELLO)
        with pytest.raises(EngineUnavailableError):
            c.capabilities()
    assert "connection refused" in err.value.message
    assert "restarting" in err.value.hint


def test_stream_cut_midway_keeps_the_partial_answer(standin: StandIn) -> None:
    standin.tokens = [
        ("reasoning", "Hmm. "),
        ("content", "The answer"),
        ("content", " is"),
        ("content", " 42"),
    ]
    standin.cut_after = 3
    got: list[str] = []
    with client_for(standin) as c, pytest.raises(ChatStreamError) as err:
        c.chat(HELLO, on_delta=lambda d: got.append(d.text))
    result = err.value.result
    assert result.partial
    assert not result.cancelled
    assert result.text == "The answer is"
    assert result.reasoning == "Hmm. "
    assert got == ["Hmm. ", "The answer", " is"]
    assert "stopped in the middle of the answer" in err.value.message
    assert "partial answer is kept" in err.value.hint


def test_error_event_mid_stream_keeps_the_partial_answer(standin: StandIn) -> None:
    standin.error_after = 2
    with client_for(standin) as c, pytest.raises(ChatStreamError) as err:
        c.chat(HELLO)
    assert "out of memory" in err.value.message
    assert err.value.result.text == "Hello"
    assert err.value.result.partial


def test_cancel_mid_stream_hangs_up_and_returns_what_arrived(standin: StandIn) -> None:
    standin.tokens = [("content", f"w{i} ") for i in range(2000)]
    standin.token_delay = 0.005
    token = CancelToken()
    n = 0

    def on_delta(d: ChatDelta) -> None:
        nonlocal n
        n += 1
        if n == 10:
            threading.Thread(target=token.cancel).start()

    t0 = time.monotonic()
    with client_for(standin) as c:
        result = c.chat(HELLO, on_delta=on_delta, cancel=token)
    assert time.monotonic() - t0 < 3
    assert result.cancelled
    assert result.partial
    assert result.text.startswith("w0 w1 w2 ")
    # the server notices the hang-up and stops producing
    assert standin.client_gone.wait(3)
    assert standin.finished.wait(3)
    assert standin.tokens_sent < 2000


def test_cancel_while_the_engine_is_still_reading_the_prompt(standin: StandIn) -> None:
    standin.hold_s = 30  # no headers yet: a long prefill
    token = CancelToken()
    threading.Timer(0.3, token.cancel).start()
    t0 = time.monotonic()
    with client_for(standin) as c:
        result = c.chat(HELLO, cancel=token)
    assert time.monotonic() - t0 < 3
    assert result.cancelled
    assert result.text == ""
    assert standin.client_gone.wait(3)


def test_already_cancelled_token_sends_nothing(standin: StandIn) -> None:
    token = CancelToken()
    token.cancel()
    with client_for(standin) as c:
        result = c.chat(HELLO, cancel=token)
    assert result.cancelled
    assert standin.requests == []


def test_images_go_as_data_url_parts(standin: StandIn) -> None:
    img = prepare_image(PNG_1x1, name="dot.png")
    with client_for(standin) as c:
        c.chat([ChatMessage("user", "What is this?", (img,))])
    (msg,) = standin.requests[0]["messages"]
    assert msg["content"][0]["type"] == "image_url"
    assert msg["content"][0]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
    assert msg["content"][1] == {"type": "text", "text": "What is this?"}


def test_images_are_refused_up_front_without_vision(standin: StandIn) -> None:
    standin.props = {**standin.props, "modalities": {"vision": False, "audio": False}}
    img = prepare_image(PNG_1x1, name="dot.png")
    with client_for(standin) as c, pytest.raises(ImageError) as err:
        c.chat([ChatMessage("user", "What is this?", (img,))])
    assert "has no vision" in err.value.message
    assert "--mmproj" in err.value.hint
    assert standin.requests == []


def test_one_client_serves_concurrent_requests(standin: StandIn) -> None:
    results: list[str] = []
    with client_for(standin) as c:
        threads = [
            threading.Thread(target=lambda: results.append(c.chat(HELLO).text)) for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert results == ["Hello world"] * 4


def test_answer_timeout_when_configured_is_a_plain_error(standin: StandIn) -> None:
    standin.hold_s = 5
    c = ChatClient(ChatEndpoint(standin.url), answer_timeout=0.3)
    with c, pytest.raises(EngineUnavailableError) as err:
        c.chat(HELLO)
    assert "did not answer in time" in err.value.message
