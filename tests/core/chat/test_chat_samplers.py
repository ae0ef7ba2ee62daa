"""Top-k, min-p and repeat penalty: sent under the name each server reads, left out (and
said so) where a server reads none, kept with the conversation, absent in old records."""

from __future__ import annotations

from k3desk.core.chat.dialects import ServerInfo, ignored_settings, request_body
from k3desk.core.chat.model import ChatSettings
from tests.core.chat.test_chat_cli import k3chat

__all__ = ["k3chat"]  # the fixture, used here

MSGS = [{"role": "user", "content": "Hi"}]
SET = ChatSettings(top_k=7, min_p=0.1, repeat_penalty=1.15, seed=3)


def test_llama_server_gets_its_field_names() -> None:
    body = request_body(ServerInfo("llama-server"), MSGS, SET, None)
    assert (body["top_k"], body["min_p"], body["repeat_penalty"], body["seed"]) == (7, 0.1, 1.15, 3)
    assert not ignored_settings(ServerInfo("llama-server"), SET)


def test_vllm_reads_repetition_penalty() -> None:
    body = request_body(ServerInfo("vllm"), MSGS, SET, None)
    assert body["repetition_penalty"] == 1.15
    assert "repeat_penalty" not in body


def test_a_server_that_reads_none_gets_none_and_the_person_is_told() -> None:
    for dialect in ("openai", "sparkinfer-bridge"):
        body = request_body(ServerInfo(dialect), MSGS, SET, None)
        assert not {"top_k", "min_p", "repeat_penalty"} & set(body)
        said = " ".join(ignored_settings(ServerInfo(dialect), SET))
        assert "top-k, min-p, repeat penalty" in said


def test_unset_means_the_servers_own_and_old_records_read_as_unset() -> None:
    body = request_body(ServerInfo("llama-server"), MSGS, ChatSettings(), None)
    assert not {"top_k", "min_p", "repeat_penalty", "seed"} & set(body)
    assert ChatSettings.from_dict(SET.to_dict()) == SET
    old = {"temperature": 0.7, "top_p": 0.9, "seed": None}  # stored before these existed
    s = ChatSettings.from_dict(old)
    assert (s.top_k, s.min_p, s.repeat_penalty) == (None, None, None)


def test_k3desk_chat_takes_them_too(k3chat, standin) -> None:  # type: ignore[no-untyped-def]
    args = ("--top-k", "7", "--min-p", "0.1", "--repeat-penalty", "1.15", "--seed", "3")
    rc, _out, _err = k3chat("--url", standin.url, *args, "Hello")
    assert rc == 0
    sent = standin.requests[0]  # a llama-server (it answers /props)
    assert (sent["top_k"], sent["min_p"], sent["repeat_penalty"], sent["seed"]) == (7, 0.1, 1.15, 3)
