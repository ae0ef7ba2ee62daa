"""Every setting the chat window offers, against the real llama-server and the SparkInfer
bridge, in one suite: the same chat works the same way on both, and where a server cannot
do something, k3desk says so (or refuses before sending) instead of failing silently.

The llama-server is llama.cpp b11434 serving the tiny kimi-k3 (its own ``/apply-template``
renders what a request asks of the chat template; ``/slots`` shows the sampling it used).
The bridge is the recipe's bridge stand-in in front of the TP3 rank 0 stand-in
(tests/fakes/sparkinfer), whose log line per request (``[k3-dist][serve] prompt_tokens=
generated_tokens=``) tells what reached the engine.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from k3desk.core.chat.channels import MARKERS
from k3desk.core.chat.client import (
    AuthError,
    ChatClient,
    ChatEndpoint,
    ChatMessage,
    ChatResult,
    ContextOverflowError,
)
from k3desk.core.chat.dialects import ignored_settings
from k3desk.core.chat.model import ChatSettings
from k3desk.core.errors import ChatError
from k3desk.core.progress import CancelToken
from tests.core.chat.conftest import RealServer
from tests.fakes.sparkinfer.local import LocalBridge, local_bridge, start_local_bridge

pytestmark = pytest.mark.engine

# llama-server: random weights may end early, ignore_eos makes answers exactly max_tokens
# long; the bridge drops fields it does not know (pydantic), as it does every extra field
LONG = {"ignore_eos": True}
HELLO = [ChatMessage("user", "hello over three sparks")]
SERVE = re.compile(r"prompt_tokens=(\d+) generated_tokens=(\d+)")


@dataclass
class Target:
    kind: str
    endpoint: ChatEndpoint
    llama: RealServer | None = None
    bridge: LocalBridge | None = None
    seen: int = 0  # the bridge's requests read so far (rank 0's lines)

    def __post_init__(self) -> None:
        if self.bridge is not None:
            self.seen = len(self.bridge.serve_lines())

    def next_request(self) -> tuple[int, int]:
        """The bridge's next request as rank 0 logged it (after it answered: waits)."""
        assert self.bridge is not None
        deadline = time.monotonic() + 10
        while len(lines := self.bridge.serve_lines()) <= self.seen:
            assert time.monotonic() < deadline, "rank 0 logged no request"
            time.sleep(0.02)
        m = SERVE.search(lines[self.seen])
        assert m is not None
        self.seen += 1
        return int(m.group(1)), int(m.group(2))

    def client(self, *, key: bool = True) -> ChatClient:
        ep = self.endpoint
        return ChatClient(ChatEndpoint(ep.base_url, ep.api_key if key else None))

    def engine_requests(self) -> list[tuple[int, int]]:
        """(prompt tokens, generated tokens) of every request that reached the engine."""
        if self.bridge is not None:
            return [tuple(map(int, m.groups())) for x in self.bridge.serve_lines()
                    if (m := SERVE.search(x))]  # type: ignore[misc]  # fmt: skip
        assert self.llama is not None
        r = httpx.get(f"{self.llama.url}/metrics", headers=self._auth(), timeout=5)
        prompt = [ln for ln in r.text.splitlines() if ln.startswith("llamacpp:prompt_tokens_total")]
        return [(int(float(prompt[0].split()[-1])), self.llama.tokens_predicted())]

    def prompt_tokens(self, result: ChatResult) -> int:
        """How long the prompt of the last answer was, by the engine's own count."""
        if self.bridge is not None:
            return self.next_request()[0]
        assert result.usage is not None
        assert not result.usage.estimated
        return result.usage.prompt_tokens

    def generated(self, result: ChatResult) -> int:
        if self.bridge is not None:
            return self.next_request()[1]
        assert result.usage is not None
        return result.usage.completion_tokens

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.endpoint.api_key}"}


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBridge]:
    b = start_local_bridge(
        tmp_path_factory.mktemp("bridge"), env={"FAKE_SPARKINFER_TOKEN_S": "0.01"}
    )
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(params=["llama-server", "sparkinfer-bridge"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "llama-server":
        srv: RealServer = request.getfixturevalue("k3_server")
        return Target("llama-server", ChatEndpoint(srv.url, srv.api_key), llama=srv)
    b: LocalBridge = request.getfixturevalue("bridge")
    return Target("sparkinfer-bridge", ChatEndpoint(b.url, b.api_key), bridge=b)


def no_marker(*texts: str) -> None:
    for t in texts:
        assert not any(m in t for m in MARKERS), t


def test_the_server_is_told_apart(target: Target) -> None:
    with target.client() as c:
        info = c.server()
    assert info.dialect == target.kind
    if target.kind == "sparkinfer-bridge":
        # the bridge's own refusal named its K3_MAX_TOKENS; nothing reached the engine
        assert info.limits.max_tokens == 512
        assert info.limits.context == 8192
        assert info.describe().startswith("SparkInfer bridge (engine 127.0.0.1:")
        assert "found by /healthz and /readyz" in info.describe()
    else:
        assert info.limits.context == 4096
        assert "found by /props" in info.describe()


def test_thinking_on_shows_the_reasoning_apart_and_off_shows_none(target: Target) -> None:
    with target.client() as c:
        on = c.chat(HELLO, ChatSettings(max_tokens=48, seed=1, extra_body=LONG))
        off = c.chat(HELLO, ChatSettings(max_tokens=48, seed=1, thinking=False, extra_body=LONG))
    assert on.reasoning.strip()
    assert off.reasoning == ""
    assert off.text.strip()
    no_marker(on.text, on.reasoning, off.text)
    if target.kind == "sparkinfer-bridge":  # the stand-in model's words: nothing lost
        assert on.reasoning == "The user wrote something ; answer"
        assert on.text == "Neuron TP3 stand-in heard: hello over three sparks"
        assert off.text == on.text


def test_the_effort_reaches_the_template_or_is_said_to_be_ignored(target: Target) -> None:
    s = ChatSettings(max_tokens=8, seed=1, thinking_effort="low", extra_body=LONG)
    with target.client() as c:
        c.server()  # the request's form follows what the server is
        body = c.build_body(HELLO, s)
        result = c.chat(HELLO, s)
        notes = ignored_settings(c.server(), s)
    assert result.text or result.reasoning
    if target.llama is not None:
        srv = target.llama
        rendered = httpx.post(f"{srv.url}/apply-template", json=body, headers=target._auth())
        assert "thinking_effort=low" in rendered.json()["prompt"]  # llama-server read it
        assert notes == []
    else:
        assert "thinking_effort" not in repr(body)
        assert (
            "The SparkInfer bridge takes no thinking effort: its chat template's default (max) "
            "applies."
        ) in notes


def test_the_system_prompt_is_part_of_the_prompt(target: Target) -> None:
    s = ChatSettings(max_tokens=4, seed=1, thinking=False, extra_body=LONG)
    with target.client() as c:
        plain = c.chat(HELLO, s)
        n_plain = target.prompt_tokens(plain)
        system = c.chat([ChatMessage("system", "You are terse and answer in French."), *HELLO], s)
        n_system = target.prompt_tokens(system)
    assert n_system > n_plain + 5


def test_temperature_and_top_p_are_used_or_said_to_have_no_effect(target: Target) -> None:
    cool = ChatSettings(temperature=0.3, top_p=0.7, max_tokens=8, seed=3, thinking=False,
                        extra_body=LONG)  # fmt: skip
    warm = ChatSettings(temperature=1.5, top_p=1.0, max_tokens=8, seed=3, thinking=False,
                        extra_body=LONG)  # fmt: skip
    with target.client() as c:
        a = c.chat(HELLO, cool)
        if target.llama is not None:
            slots = target.llama.slots()
            params = slots[0].get("params") or {}
            assert params["temperature"] == pytest.approx(0.3)
            assert params["top_p"] == pytest.approx(0.7)
            assert ignored_settings(c.server(), cool) == []
            return
        b = c.chat(HELLO, warm)
        assert a.text == b.text  # greedy: the same answer whatever the temperature
        assert (
            "The SparkInfer bridge decodes greedily: temperature and top-p have no effect."
        ) in ignored_settings(c.server(), cool)


def test_max_tokens_ends_the_answer_there(target: Target) -> None:
    with target.client() as c:
        result = c.chat(HELLO, ChatSettings(max_tokens=6, seed=1, thinking=False, extra_body=LONG))
    assert result.finish_reason == "length"
    assert target.generated(result) == 6
    assert not result.partial


def test_without_max_tokens_the_answer_may_be_as_long_as_the_server_allows(
    target: Target,
) -> None:
    with target.client() as c:
        c.server()
        body = c.build_body(HELLO, ChatSettings())
    if target.bridge is not None:
        # not the bridge's default of 512 when max_tokens is missing: all it allows
        assert body["max_tokens"] == 512
    else:
        assert "max_tokens" not in body  # llama-server: until the end, or the context


def test_more_tokens_than_the_server_allows_is_explained_before_sending(
    target: Target,
) -> None:
    before = target.engine_requests()
    s = ChatSettings(max_tokens=600, seed=1, thinking=False)
    with target.client() as c:
        if target.bridge is None:
            result = c.chat(HELLO, s)  # llama-server: 600 of its 4096 is fine
            assert result.text or result.finish_reason
            return
        with pytest.raises(ChatError) as err:
            c.chat(HELLO, s)
    assert err.value.message == (
        "This conversation asks for up to 600 tokens per answer, and the SparkInfer bridge "
        "allows at most 512 (K3_MAX_TOKENS on the bridge); it would refuse the request."
    )
    assert target.engine_requests() == before  # nothing was sent


def test_a_stop_sequence_ends_the_answer_where_it_would_come(target: Target) -> None:
    s = ChatSettings(max_tokens=24, seed=1, thinking=False, extra_body=LONG)
    with target.client() as c:
        full = c.chat(HELLO, s).text
        words = [m.start() for m in re.finditer(r"\w{3,}", full)]
        assert words, full
        at = words[len(words) // 2]
        stop = full[at : at + 3]
        cut = c.chat(HELLO, ChatSettings(**{**s.to_dict(), "stop": (stop,)}))
    assert cut.text == full[: full.find(stop)]
    assert cut.finish_reason == "stop"
    assert not cut.partial


def test_stop_ends_the_answer_and_keeps_what_arrived(target: Target) -> None:
    cancel = CancelToken()
    got: list[str] = []

    def first(delta: Any) -> None:
        got.append(delta.text)
        cancel.cancel()

    with target.client() as c:
        result = c.chat(
            HELLO, ChatSettings(max_tokens=300, seed=1, extra_body=LONG),
            on_delta=first, cancel=cancel,
        )  # fmt: skip
    assert result.cancelled
    assert result.partial
    assert got
    assert (result.text + result.reasoning).startswith(got[0].strip()[:1])


def test_speed_and_tokens_are_shown_and_say_who_measured_them(target: Target) -> None:
    with target.client() as c:
        result = c.chat(HELLO, ChatSettings(max_tokens=24, seed=1, extra_body=LONG))
    assert result.timings is not None
    assert result.timings.predicted_per_second > 0
    assert result.usage is not None
    assert result.usage.completion_tokens > 0
    if target.bridge is not None:
        # no usage and no timings in the bridge's stream: k3desk measured them
        assert result.timings.by_client
        assert result.usage.estimated
        prompt, generated = target.next_request()
        logged = target.bridge.serve_lines()[target.seen - 1]
        decode_s = float(re.search(r"decode_s=([\d.]+)", logged).group(1))  # type: ignore[union-attr]
        rate = generated / decode_s
        assert 0.2 * rate < result.timings.predicted_per_second < 1.5 * rate
        assert abs(result.usage.prompt_tokens - prompt) <= prompt  # an estimate, near
    else:
        assert not result.timings.by_client
        assert not result.usage.estimated


def test_a_conversation_too_long_for_the_context_is_refused_clearly(target: Target) -> None:
    before = target.engine_requests()
    long = [ChatMessage("user", "hello " * 12000)]  # 72 kB
    with target.client() as c, pytest.raises(ContextOverflowError) as err:
        c.chat(long, ChatSettings(max_tokens=8, thinking=False))
    assert "too long" in err.value.message
    if target.bridge is not None:
        assert "K3_MAX_CONTEXT_TOKENS" in err.value.message
        assert target.engine_requests() == before  # explained before it was sent


def test_a_missing_key_is_refused_clearly(target: Target) -> None:
    with target.client(key=False) as c, pytest.raises(AuthError) as err:
        c.chat(HELLO, ChatSettings(max_tokens=4))
    assert "needs an API key (HTTP 401" in err.value.message


def test_one_answer_at_a_time_is_what_the_bridge_does(bridge: LocalBridge) -> None:
    """Two chats at once: the bridge serialises them; both complete, in full."""
    results: list[ChatResult] = []

    def ask() -> None:
        with ChatClient(ChatEndpoint(bridge.url, bridge.api_key)) as c:
            results.append(c.chat(HELLO, ChatSettings(thinking=False)))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.text for r in results] == ["Neuron TP3 stand-in heard: hello over three sparks"] * 2


def test_channel_markers_a_server_hands_through_are_separated_and_hidden(
    tmp_path: Path,
) -> None:
    """A reply the bridge's extraction does not clean (a tools section inside the
    response, stray control tokens): k3desk still shows no marker."""
    reply = (
        "what is here<|close|>think<|sep|><|open|>response<|sep|>hello "
        "<|open|>tools<|sep|>world [EOS]<|close|>response<|sep|><|end_of_msg|>"
    )
    with (
        local_bridge(tmp_path, env={"FAKE_SPARKINFER_REPLY": reply}) as b,
        ChatClient(ChatEndpoint(b.url, b.api_key)) as c,
    ):
        result = c.chat(HELLO, ChatSettings())
        raw = httpx.post(
            f"{b.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {b.api_key}"},
            json={"messages": [{"role": "user", "content": "hi"}], "thinking": True},
        ).json()["choices"][0]["message"]
    assert "<|open|>tools<|sep|>" in raw["content"]  # what the bridge itself returns
    assert result.reasoning == "what is here"
    assert result.text.strip() == "hello world"
    no_marker(result.text, result.reasoning)


def test_a_server_kind_with_the_bridges_quirks_is_treated_like_the_bridge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The quirks follow the Dialect's fields, not its name: a kind given the bridge's
    limits, model name and short default answer is refused, budgeted and addressed the
    same way before anything is sent (no server is needed for that)."""
    from dataclasses import replace

    from k3desk.core.chat import dialects

    quirky = replace(
        dialects.DIALECTS["vllm"],
        fixed_limits=dialects.Limits(100, 10, 400, "its settings"),
        limits_setting="MAX_NEW on the server",
        context_covers_answer=True,
        short_default_answer=True,
        model_name="the-only-model",
    )
    monkeypatch.setitem(dialects.DIALECTS, "vllm", quirky)
    client = ChatClient(ChatEndpoint("http://127.0.0.1:9", dialect="vllm"))
    try:
        body = client.build_body([ChatMessage("user", "hello")])
        assert body["model"] == "the-only-model"
        assert 0 < body["max_tokens"] <= 100  # asked for, within what it allows
        with pytest.raises(ChatError, match=r"at most 100 \(MAX_NEW on the server\)"):
            client.build_body([ChatMessage("user", "hello")], ChatSettings(max_tokens=101))
        with pytest.raises(ContextOverflowError):
            client.build_body([ChatMessage("user", "word " * 2000)])
    finally:
        client.close()
    plain = ChatClient(ChatEndpoint("http://127.0.0.1:9", dialect="openai"))
    try:
        body = plain.build_body([ChatMessage("user", "word " * 2000)])
        assert "max_tokens" not in body or body["max_tokens"] is None
    finally:
        plain.close()
