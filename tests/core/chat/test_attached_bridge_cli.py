"""``k3desk chat --url`` and ``k3desk cluster endpoint`` against the recipe's bridge, and
how k3desk tells the other servers apart (vLLM's /version, a generic OpenAI server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import k3desk.cli as cli
from k3desk.app import Services
from k3desk.core.chat.channels import MARKERS
from k3desk.core.chat.client import ChatClient, ChatEndpoint, ChatMessage
from k3desk.core.chat.model import ChatSettings
from k3desk.core.cluster.endpoints import EndpointStore
from k3desk.core.errors import ChatError
from k3desk.core.paths import default_paths
from tests.core.chat.conftest import StandIn
from tests.fakes.sparkinfer.local import LocalBridge, start_local_bridge


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBridge]:
    b = start_local_bridge(tmp_path_factory.mktemp("bridge"))
    try:
        yield b
    finally:
        b.stop()


def k3desk(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv), Services())
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_chat_url_through_the_bridge(
    bridge: LocalBridge, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = k3desk(
        capsys, "chat", "--url", bridge.url, "--api-key", bridge.api_key, "--effort", "low",
        "hello over three sparks",
    )  # fmt: skip
    assert rc == 0, err
    assert out == "Neuron TP3 stand-in heard: hello over three sparks\n"  # the real answer
    assert "The user wrote something ; answer" in err  # the reasoning, on stderr
    assert err.startswith("Server: SparkInfer bridge (engine 127.0.0.1:")
    assert "; at most 512 tokens per answer, 8,192 tokens of context." in err
    assert "The SparkInfer bridge takes no thinking effort" in err
    assert "measured by k3desk: the server reports none" in err
    assert " tok/s" in err
    assert not [m for m in MARKERS if m in out + err]

    rc, out, err = k3desk(
        capsys, "chat", "--url", bridge.url, "--api-key", bridge.api_key, "--no-thinking",
        "hello over three sparks",
    )  # fmt: skip
    assert rc == 0, err
    assert out == "Neuron TP3 stand-in heard: hello over three sparks\n"
    assert "The user wrote" not in err  # thinking off: no reasoning at all


def test_chat_url_refuses_before_sending_what_the_bridge_would_refuse(
    bridge: LocalBridge, capsys: pytest.CaptureFixture[str]
) -> None:
    before = len(bridge.serve_lines())
    rc, _out, err = k3desk(
        capsys, "chat", "--url", bridge.url, "--api-key", bridge.api_key, "--max-tokens", "4096",
        "hello",
    )  # fmt: skip
    assert rc != 0
    assert "allows at most 512 (K3_MAX_TOKENS on the bridge); it would refuse" in err
    assert "Traceback" not in err
    assert len(bridge.serve_lines()) == before


def test_an_attached_bridge_keeps_what_it_is(
    bridge: LocalBridge, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = k3desk(
        capsys, "cluster", "endpoint", "add", "sparks", bridge.url + "/v1", "--key-env",
        "SPARKS_KEY",
    )  # fmt: skip
    assert rc != 0  # the variable is not set: the bridge refuses without its key
    assert "needs an API key (HTTP 401" in err
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKS_KEY", bridge.api_key)
        rc, out, err = k3desk(
            capsys, "cluster", "endpoint", "add", "sparks", bridge.url + "/v1", "--key-env",
            "SPARKS_KEY",
        )  # fmt: skip
        assert rc == 0, err
        assert "text only" in out
        assert "  Server: SparkInfer bridge (engine 127.0.0.1:" in out
        stored = EndpointStore(default_paths()).get("sparks")
        assert stored.server == "sparkinfer-bridge"
        assert not stored.server_set
        rc, out, _ = k3desk(capsys, "cluster", "endpoint", "list")
        assert "SparkInfer bridge" in out
        with EndpointStore(default_paths()).client("sparks") as c:
            result = c.chat([ChatMessage("user", "hello over three sparks")], ChatSettings())
        assert result.reasoning == "The user wrote something ; answer"
        assert result.text == "Neuron TP3 stand-in heard: hello over three sparks"

        # told it is a generic server, k3desk speaks plain OpenAI to it: the bridge then
        # renders without thinking (it reads only its top-level flag)
        rc, out, _ = k3desk(capsys, "cluster", "endpoint", "set", "sparks", "--server", "openai")
        assert rc == 0
        assert "treated as OpenAI-compatible server" in out
        with EndpointStore(default_paths()).client("sparks") as c:
            generic = c.chat([ChatMessage("user", "hello over three sparks")], ChatSettings())
            assert c.server().overridden
        assert generic.reasoning == ""
        rc, out, _ = k3desk(capsys, "cluster", "endpoint", "set", "sparks", "--server", "auto")
        assert rc == 0
        rc, out, _ = k3desk(capsys, "cluster", "endpoint", "check", "sparks")
        assert rc == 0
        assert "Server: SparkInfer bridge (engine 127.0.0.1:" in out
        assert "found by /healthz and /readyz" in out
        assert EndpointStore(default_paths()).get("sparks").server == "sparkinfer-bridge"


def test_a_bridge_under_transformers_5_is_explained_not_chatted_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: the bridge runs, and refuses every request."""
    from tests.fakes.sparkinfer.stand_in import bridge_python

    b = start_local_bridge(tmp_path, python=bridge_python(5))
    try:
        with ChatClient(ChatEndpoint(b.url, b.api_key)) as c:
            info = c.server()
            assert "its transformers is 5.x" in info.problem
            with pytest.raises(ChatError) as err:
                c.chat([ChatMessage("user", "hello")])
        assert err.value.message.startswith(
            "The SparkInfer bridge answers but cannot chat: the bridge cannot turn a chat "
            "into tokens: its transformers is 5.x"
        )
        assert "transformers>=4.45,<5" in err.value.message
        assert b.serve_lines() == []  # nothing reached the engine
        rc, out, _err_text = k3desk(
            capsys, "cluster", "endpoint", "add", "t5", b.url, "--key", b.api_key
        )
        assert rc == 0
        assert "  Server: SparkInfer bridge" in out
        assert "— the bridge cannot turn a chat into tokens" in out
    finally:
        b.stop()


def test_vllm_and_generic_servers_are_told_apart(standin: StandIn) -> None:
    standin.props = None
    standin.models = {"object": "list", "data": [{"id": "k3", "max_model_len": 32768}]}
    with ChatClient(ChatEndpoint(standin.url)) as c:
        generic = c.server()
        body = c.build_body([ChatMessage("user", "hi")], ChatSettings(stop=("END",)))
    assert generic.dialect == "openai"
    assert generic.limits.context == 32768
    assert body["chat_template_kwargs"] == {"thinking": True}
    assert body["stop"] == ["END"]

    standin.version = {"version": "0.11.0"}
    with ChatClient(ChatEndpoint(standin.url)) as c:
        vllm = c.server()
        body = c.build_body(
            [ChatMessage("user", "hi")], ChatSettings(thinking_effort="high", seed=3)
        )
    assert vllm.dialect == "vllm"
    assert vllm.describe() == "vLLM (vLLM 0.11.0; found by /version)"
    assert body["chat_template_kwargs"] == {"thinking": True, "thinking_effort": "high"}
    assert body["seed"] == 3
    assert body["stream_options"] == {"include_usage": True}
    # vLLM reports usage but no timings: k3desk measures the speed
    with ChatClient(ChatEndpoint(standin.url)) as c:
        result = c.chat([ChatMessage("user", "hi")])
    assert result.timings is not None
    assert not result.timings.by_client  # this stand-in sends llama-server's timings
