"""A tool's conversation continued after the engine restarted starts from its kept state.

`k3desk serve` runs the real llama-server b11434 on the tiny Kimi-K3 behind its front; the
client is the real OpenAI SDK, sending the whole conversation each time as tools do.  The
oracles are the engine's own: its timings say how many prompt tokens it read
(``prompt_n``) and took from its cache (``cache_n``, which after a kill -9 can only come
from a restored state), and the same request read again from the start gives the answer a
restored one must equal (greedy, fixed seed, thinking off).
"""

from __future__ import annotations

import base64
import io
import os
import signal
import time
from pathlib import Path
from typing import Any

import anthropic
import openai
import psutil
import pytest
from PIL import Image

from k3desk.core.chat.kept_state import states_dir
from k3desk.core.engines.ports import free_port
from k3desk.core.paths import default_paths
from k3desk.devtools.tinyk3 import TinyModel
from tests.core.engines.test_local_api import k3desk, serving

pytestmark = [pytest.mark.engine]
SYSTEM = {"role": "system", "content": "You are a storyteller."}
FIRST = {"role": "user", "content": "Tell me a long story about a cat and a dog. " * 8}
THEN = {"role": "user", "content": "And then?"}
OPTIONS: dict[str, Any] = {"seed": 1, "temperature": 0.0,
                           "chat_template_kwargs": {"thinking": False}}  # fmt: skip


def _ask(client: openai.OpenAI, messages: list[dict[str, Any]], **more: Any) -> Any:
    return client.chat.completions.create(
        model="kimi-k3",
        messages=messages,
        max_tokens=8,
        extra_body={**OPTIONS, **more},
    )


def _kept(folder: Path, at_least: int, timeout: float = 30) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(folder.glob("k3c-*.bin")) if folder.exists() else []
        if len(files) >= at_least:
            return files
        time.sleep(0.2)
    pytest.fail(f"no conversation state kept in {folder} within {timeout} s")


def _restart(pid: str) -> None:
    """kill -9 the engine: `k3desk serve` restarts it behind the same address."""
    os.kill(int(pid), signal.SIGKILL)


@pytest.mark.parametrize("answer", ["text", "thinking"])
def test_a_tools_conversation_continued_after_a_crash_starts_from_its_kept_state(
    llama_server: Path, tiny_k3_single: TinyModel, answer: str
) -> None:
    """The answer kept is the one the tool sends back: its text, and with thinking on, the
    text without the thinking the tool leaves out.  (An answer calling tools is kept the
    same way, up to its first call's result: tests/core/engines/test_sdk_clients.py holds
    that prefix against the engine's own rendering; the tiny model calls no tool itself.)"""
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    key = k3desk("api", "create", "agent").stdout.splitlines()[0]
    folder = states_dir(default_paths().cache)
    url = f"http://127.0.0.1:{port}/v1"
    serve = (str(tiny_k3_single.first_part), "--ctx", "2048", "--engine", str(llama_server))
    more: dict[str, Any] = (
        {"chat_template_kwargs": {"thinking": True}} if answer == "thinking" else {}
    )
    with serving(*serve) as facts, openai.OpenAI(base_url=url, api_key=key, max_retries=5,
                                                  timeout=60) as client:  # fmt: skip
        first = _ask(client, [SYSTEM, FIRST], **more).choices[0].message
        kept = _kept(folder, 1)  # saved once the engine was idle a few seconds
        assert all(f.stat().st_mode & 0o077 == 0 for f in kept)

        _restart(facts["Engine pid"])
        assert first.model_extra.get("reasoning_content") or answer != "thinking", first
        said = [SYSTEM, FIRST, {"role": "assistant", "content": first.content}, THEN]
        resumed = _ask(client, said, **more)  # the SDK's retries wait out the restart (503)
        timings = resumed.model_extra["timings"]
        total = resumed.usage.prompt_tokens
        # the engine read only the new question: the rest came from the restored state
        assert timings["cache_n"] > total // 2, (timings, total)
        assert timings["prompt_n"] == total - timings["cache_n"]

        # the same request read from the start (no state left): the same answer
        _restart(str(_engine_pid(port)))
        time.sleep(0.5)
        for f in folder.iterdir():
            f.unlink()
        cold = _ask(client, said, **more)
        assert cold.model_extra["timings"]["cache_n"] == 0
        assert _said(cold) == _said(resumed)


def _said(answer: Any) -> tuple[Any, ...]:
    m = answer.choices[0].message
    return m.content, m.model_extra.get("reasoning_content")


def test_an_anthropic_conversation_continued_after_a_crash_starts_from_its_kept_state(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    """A Messages conversation (the Anthropic SDK, streamed, thinking on, the answer's
    thinking blocks sent back as that API asks) comes back the same way, though its client
    changes the billing header in its system text with every request (as Claude Code does;
    the engine makes it constant)."""
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    key = k3desk("api", "create", "agent").stdout.splitlines()[0]
    folder = states_dir(default_paths().cache)
    serve = (str(tiny_k3_single.first_part), "--ctx", "2048", "--engine", str(llama_server))

    def system(cch: str) -> Any:
        billing = f"x-anthropic-billing-header: cc_version=2.1; cch={cch}; cc_entrypoint=cli"
        return [{"type": "text", "text": billing}, {"type": "text", "text": "A storyteller."}]

    def ask(client: anthropic.Anthropic, cch: str, messages: list[Any]) -> Any:
        return client.messages.create(
            model="kimi-k3", max_tokens=8, system=system(cch), messages=messages,
            extra_body={"seed": 1, "temperature": 0.0},
        )  # fmt: skip

    with serving(*serve) as facts, anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}",
                                                       api_key=key, max_retries=5,
                                                       timeout=60) as client:  # fmt: skip
        with client.messages.stream(
            model="kimi-k3", max_tokens=8, system=system("1a2b3"),
            messages=[FIRST], extra_body={"seed": 1, "temperature": 0.0},
        ) as stream:  # fmt: skip
            first = stream.get_final_message()
        assert first.content[0].type == "thinking"
        _kept(folder, 1)

        _restart(facts["Engine pid"])
        said = [FIRST, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                THEN]  # fmt: skip
        resumed = ask(client, "9z8y7", said)  # the SDK's retries wait out the restart (503)
        # the engine read only the new question: the rest came from the restored state
        assert resumed.usage.cache_read_input_tokens > resumed.usage.input_tokens, resumed.usage

        _restart(str(_engine_pid(port)))
        time.sleep(0.5)
        for f in folder.iterdir():
            f.unlink()
        cold = ask(client, "0c0c0", said)
        assert cold.usage.cache_read_input_tokens == 0
        assert cold.content == resumed.content


def test_a_responses_conversation_continued_after_a_crash_starts_from_its_kept_state(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    """A Responses conversation (the OpenAI SDK's ``responses``, streamed, thinking on, the
    answer's output items sent back in the next input, reasoning among them, as that API
    keeps a conversation with nothing stored) comes back the same way."""
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    key = k3desk("api", "create", "agent").stdout.splitlines()[0]
    folder = states_dir(default_paths().cache)
    serve = (str(tiny_k3_single.first_part), "--ctx", "2048", "--engine", str(llama_server))
    greedy = {"seed": 1, "temperature": 0.0}

    def ask(client: openai.OpenAI, given: list[Any]) -> Any:
        return client.responses.create(
            model="kimi-k3", instructions="You are a storyteller.", input=given,
            max_output_tokens=8, extra_body=greedy,
        )  # fmt: skip

    with serving(*serve) as facts, openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1",
                                                  api_key=key, max_retries=5,
                                                  timeout=60) as client:  # fmt: skip
        events = list(client.responses.create(
            model="kimi-k3", instructions="You are a storyteller.", input=[FIRST],
            max_output_tokens=8, extra_body=greedy, stream=True,
        ))  # fmt: skip
        first = events[-1].response
        assert first.output[0].type == "reasoning"
        _kept(folder, 1)

        _restart(facts["Engine pid"])
        said = [FIRST, *(item.model_dump(exclude_none=True) for item in first.output), THEN]
        resumed = ask(client, said)  # the SDK's retries wait out the restart (503)
        # the engine read only the new question: the rest came from the restored state
        usage = resumed.usage
        assert usage.input_tokens_details.cached_tokens > usage.input_tokens // 2, usage

        _restart(str(_engine_pid(port)))
        time.sleep(0.5)
        for f in folder.iterdir():
            f.unlink()
        cold = ask(client, said)
        assert cold.usage.input_tokens_details.cached_tokens == 0
        assert [i.model_dump(exclude={"id"}) for i in cold.output] == [
            i.model_dump(exclude={"id"}) for i in resumed.output
        ]


def _vision_serve(llama_server: Path, tiny_k3: TinyModel) -> tuple[int, str, Path, tuple[str, ...]]:
    """A port and a key for `k3desk serve` with the tiny K3 and its projector: the port,
    the key, the folder of kept states and the serve arguments."""
    assert tiny_k3.mmproj is not None
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    key = k3desk("api", "create", "agent").stdout.splitlines()[0]
    serve = (str(tiny_k3.first_part), "--mmproj", str(tiny_k3.mmproj), "--ctx", "2048",
             "--engine", str(llama_server))  # fmt: skip
    return port, key, states_dir(default_paths().cache), serve


def _png(colour: tuple[int, int, int]) -> str:
    """A 48x48 picture of one colour, as base64 PNG data."""
    seen = io.BytesIO()
    Image.new("RGB", (48, 48), colour).save(seen, format="PNG")
    return base64.b64encode(seen.getvalue()).decode("ascii")


def test_a_conversation_with_a_picture_continued_after_a_crash_starts_from_its_kept_state(
    llama_server: Path, tiny_k3: TinyModel
) -> None:
    """A picture sent as data (the OpenAI SDK's image_url part) is kept with the words
    around it: after kill -9 the engine reads only the new question, picture and all
    from the restored state, and answers as reading it all again does."""
    port, key, folder, serve = _vision_serve(llama_server, tiny_k3)
    url = "data:image/png;base64," + _png((200, 40, 40))
    parts = [{"type": "text", "text": "What is on it?"},
             {"type": "image_url", "image_url": {"url": url}}]  # fmt: skip
    look = {"role": "user", "content": parts}
    with serving(*serve) as facts, openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1",
                                                  api_key=key, max_retries=5,
                                                  timeout=60) as client:  # fmt: skip
        first = _ask(client, [SYSTEM, look]).choices[0].message
        _kept(folder, 1)

        _restart(facts["Engine pid"])
        said = [SYSTEM, look, {"role": "assistant", "content": first.content}, THEN]
        resumed = _ask(client, said)  # the SDK's retries wait out the restart (503)
        timings = resumed.model_extra["timings"]
        assert timings["cache_n"] > resumed.usage.prompt_tokens // 2, timings

        _restart(str(_engine_pid(port)))
        time.sleep(0.5)
        for f in folder.iterdir():
            f.unlink()
        cold = _ask(client, said)
        assert cold.model_extra["timings"]["cache_n"] == 0
        assert _said(cold) == _said(resumed)


def test_an_anthropic_picture_conversation_continued_after_a_crash_starts_from_its_kept_state(
    llama_server: Path, tiny_k3: TinyModel
) -> None:
    """A picture in a Messages conversation (the Anthropic SDK's base64 image block) is
    kept the same way: after kill -9 the engine takes the picture and the words around it
    from the restored state, and answers as reading it all again does."""
    port, key, folder, serve = _vision_serve(llama_server, tiny_k3)
    data = _png((40, 200, 40))
    picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                           "data": data}}  # fmt: skip
    look = {"role": "user", "content": [{"type": "text", "text": "What is on it?"}, picture]}

    def ask(client: anthropic.Anthropic, messages: list[Any]) -> Any:
        return client.messages.create(
            model="kimi-k3", max_tokens=8, system="A storyteller.", messages=messages,
            extra_body={"seed": 1, "temperature": 0.0},
        )  # fmt: skip

    with serving(*serve) as facts, anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}",
                                                       api_key=key, max_retries=5,
                                                       timeout=60) as client:  # fmt: skip
        first = ask(client, [look])
        _kept(folder, 1)

        _restart(facts["Engine pid"])
        said = [look, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                THEN]  # fmt: skip
        resumed = ask(client, said)  # the SDK's retries wait out the restart (503)
        # the engine read only the new question: the picture came from the restored state
        assert resumed.usage.cache_read_input_tokens > resumed.usage.input_tokens, resumed.usage

        _restart(str(_engine_pid(port)))
        time.sleep(0.5)
        for f in folder.iterdir():
            f.unlink()
        cold = ask(client, said)
        assert cold.usage.cache_read_input_tokens == 0
        assert cold.content == resumed.content


def _engine_pid(port: int) -> int:
    """The engine behind the front now (the restarted one is not the pid printed first)."""
    listening = psutil.net_connections("tcp")
    front = next(c.pid for c in listening if c.laddr and c.laddr.port == port and c.pid)
    return next(p.pid for p in psutil.Process(front).children() if "llama-server" in p.name())


def test_two_tools_conversations_each_come_back_and_stopping_keeps_the_last(
    llama_server: Path, tiny_k3_single: TinyModel
) -> None:
    """Another conversation taking the slot keeps the one answered before it first, and
    going back to that one brings its state back; Ctrl-C (SIGTERM) keeps the conversation
    answered last before the engine stops, and the next `k3desk serve` starts from it."""
    port = free_port()
    assert k3desk("api", "port", str(port)).returncode == 0
    key = k3desk("api", "create", "agent").stdout.splitlines()[0]
    folder = states_dir(default_paths().cache)
    url = f"http://127.0.0.1:{port}/v1"
    other = {"role": "user", "content": "Write a poem about the sea and a boat. " * 8}
    serve = (str(tiny_k3_single.first_part), "--ctx", "2048", "--engine", str(llama_server))
    with serving(*serve), openai.OpenAI(base_url=url, api_key=key, timeout=60) as client:
        a = [SYSTEM, FIRST]
        a.append({"role": "assistant", "content": _ask(client, a).choices[0].message.content})
        b = [SYSTEM, other]
        b.append({"role": "assistant", "content": _ask(client, b).choices[0].message.content})
        assert len(list(folder.glob("k3c-*.bin"))) == 1  # the first, kept before the second
        a.append(THEN)
        back = _ask(client, a)  # the slot holds the second: the first is brought back
        assert back.model_extra["timings"]["cache_n"] > back.usage.prompt_tokens // 2
        a += [{"role": "assistant", "content": back.choices[0].message.content},
              {"role": "user", "content": "And after that?"}]  # fmt: skip
        before = set(folder.glob("k3c-*.bin"))
    # stopped at once after its answer (no idle time): kept on the way out
    assert len(set(folder.glob("k3c-*.bin")) - before) >= 1
    with serving(*serve), openai.OpenAI(base_url=url, api_key=key, timeout=60) as client:
        again = _ask(client, a)
        assert again.model_extra["timings"]["cache_n"] > back.usage.prompt_tokens
