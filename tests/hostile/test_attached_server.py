"""An attached server (``chat --url``, an endpoint) that misbehaves: every read from it is
bounded in bytes, lines, events and tokens, wrong JSON types are a clear error, and what
it says is shown on a terminal, not acted on by it.

Memory is the growth of this process's resident memory while the hostile server sends
(it runs in this process too, generating what it sends as it goes); time is bounded to
10 s per case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k3desk.core.chat.client import (
    ChatClient,
    ChatEndpoint,
    ChatError,
    ChatMessage,
    ChatSettings,
    ChatStreamError,
)
from tests.hostile.conftest import bounded, no_traceback, run_k3desk
from tests.hostile.hostile_chat import HostileChat

MiB = 1024 * 1024
HI = [ChatMessage("user", "hi")]
PEAK = 256 * MiB


def ask(server: HostileChat, settings: ChatSettings | None = None) -> Any:
    client = ChatClient(ChatEndpoint(server.url, "sk-attached"))

    def chat() -> Any:
        try:
            return client.chat(HI, settings or ChatSettings(thinking=False))
        finally:
            client.close()

    return bounded(chat, 10, stop=client.close)


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("long_line", "a line of the answer stream is longer than 1,048,576 bytes"),
        ("flood", "one event of the answer stream is longer than 1,048,576 bytes"),
        ("gzip_bomb", "the answer stream is longer than 67,108,864 bytes"),
    ],
)
def test_an_endless_answer_is_cut_off_with_a_message_in_bounded_memory(
    mode: str, said: str
) -> None:
    with HostileChat(mode) as server:
        run = ask(server)
    assert isinstance(run.error, ChatStreamError), run.error
    assert "k3desk stopped reading" in run.error.message
    assert said in run.error.message, run.error.message
    assert run.peak_rss_growth < PEAK, run.peak_rss_growth


def test_a_200_mb_error_body_is_read_only_as_far_as_it_is_shown() -> None:
    with HostileChat("big_error") as server:
        run = ask(server)
    assert isinstance(run.error, ChatError)
    assert "failed (HTTP 500" in run.error.message
    assert run.peak_rss_growth < PEAK, run.peak_rss_growth
    assert server.sent < 16 * MiB  # k3desk hung up


def test_a_300_mb_model_list_is_refused_not_read_whole() -> None:
    with HostileChat("big_models") as server:
        client = ChatClient(ChatEndpoint(server.url))
        run = bounded(client.capabilities, 10, stop=client.close)
        client.close()
    assert isinstance(run.error, ChatError)
    assert "answered /v1/models with more than k3desk reads" in run.error.message
    assert "longer than 4,194,304 bytes" in run.error.message
    assert run.peak_rss_growth < PEAK, run.peak_rss_growth


def test_max_tokens_is_held_when_the_server_goes_on() -> None:
    with HostileChat("pings") as server:
        run = ask(server, ChatSettings(thinking=False, max_tokens=5))
    assert run.error is None, run.error
    assert run.value.text == "tok " * 5
    assert run.value.finish_reason == "length"
    assert run.value.usage.completion_tokens == 5


@pytest.mark.parametrize(
    ("events", "said"),
    [
        ([{"choices": "oops"}], "'choices' is str, not a list"),
        ([{"choices": [7]}], "a choice is int, not an object"),
        ([{"choices": [{"delta": ["x"]}]}], "'delta' is list, not an object"),
        ([{"choices": [{"delta": {"content": {"a": 1}}}]}], "'content' is dict, not text"),
        ([{"choices": [{"delta": {"content": "hi"}, "finish_reason": 3}]}], "'finish_reason'"),
        ([{"choices": [], "usage": {"prompt_tokens": "many"}}], "ValueError"),
        ([{"choices": [], "timings": {"prompt_n": 1e400}}], "OverflowError"),
    ],
)
def test_wrong_json_types_in_a_stream_are_a_clear_error(events: list[Any], said: str) -> None:
    with HostileChat("wrong_types", events=events) as server:
        run = ask(server)
    assert isinstance(run.error, ChatStreamError), repr(run.error)
    assert "sent an event k3desk cannot read" in run.error.message
    assert said in run.error.message, run.error.message


def test_the_cli_says_what_is_wrong_with_wrong_types_and_a_broken_url() -> None:
    with HostileChat("wrong_types", events=[{"choices": [{"delta": "x"}]}]) as server:
        r = run_k3desk("chat", "--url", server.url, "hi", timeout=30)
    no_traceback(r.stderr)
    assert r.returncode == 1
    assert "sent an event k3desk cannot read" in r.stderr.decode()

    for argv in (("chat", "--url", "http://[::1", "hi"), ("cluster", "endpoint", "add", "x",
                 "http://[::1", "--no-check")):  # fmt: skip
        r = run_k3desk(*argv, timeout=30)
        no_traceback(r.stderr)
        assert r.returncode == 1
        assert "error: 'http://[::1' is not a URL k3desk can use" in r.stderr.decode()


def test_escape_sequences_in_an_answer_are_shown_not_acted_on() -> None:
    with HostileChat("escapes") as server:
        r = run_k3desk("chat", "--url", server.url, "hi", timeout=30)
    no_traceback(r.stderr)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "\x1b" not in out
    assert "\x07" not in out
    assert "\x9b" not in out
    assert "\r" not in out
    assert "safe \\u001b]0;owned\\u0007\\u001b[2J\\u001b[31mred\\u009b1m\\u000d hidden" in out


def test_escape_sequences_in_gguf_strings_and_file_names_are_shown_not_acted_on(
    tmp_path: Path,
) -> None:
    from k3desk.core.engines.canary import write_k3_gguf

    evil = "evil\x1b]0;owned\x07\x1b[2J"
    (shard,) = write_k3_gguf(tmp_path, evil, seed=1)  # general.name and the file name
    r = run_k3desk("validate", shard, timeout=60)
    no_traceback(r.stderr)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "\x1b" not in out
    assert "\x07" not in out
    assert "Model:        evil\\u001b]0;owned\\u0007\\u001b[2J  [kimi-k3]" in out
    assert "starting evil\\u001b]0;owned\\u0007\\u001b[2J.gguf" in out
