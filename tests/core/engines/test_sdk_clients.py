"""A person's own tools, driven by the real OpenAI and Anthropic Python SDKs, against the
llama-server k3desk launches.

The launch is the real one (``prepare_launch`` probes the real llama-server b11434, the
Supervisor starts it with the tiny Kimi-K3 and its projector); each SDK is pointed at the
endpoint's URL and key the way a person would set it up: ``base_url=<url>/v1`` for
OpenAI, ``base_url=<url>`` for Anthropic.  The tiny model has random weights, so these
tests fix the seed, sample greedily, keep answers short and assert the shape of what
comes back, never its words.

What the engine does differently from the APIs the SDKs were written for, asserted as it
is (``tools/server/`` in b11434):

* ``tool_choice`` naming one function (OpenAI's ``{"type": "function", "function":
  {"name": ...}}``) is read as a string only (``server-common.cpp``,
  ``oaicompat_chat_params_parse``: ``json_value(body, "tool_choice",
  std::string("auto"))``): the object falls back to ``"auto"``, with a warning in the
  engine's log, and nothing is forced.  ``"required"`` is honoured.
* Anthropic's ``tool_choice={"type": "tool", "name": ...}`` becomes ``"required"``
  (``server-chat.cpp``, the Anthropic-to-OpenAI conversion): some tool is called, not
  necessarily the one named.
* ``"required"`` forces the Kimi-K3 tools section only after whatever answer text the
  model writes first (``common/parsers/kimi-k3.cpp``: the response comes before the
  tools, unconstrained), so a random model never gets there.  The tool-call tests hand
  the model the start of its answer (an assistant message last: llama-server continues
  it) holding a call in K3's own markup, and check that the engine's Kimi-K3 handler
  turns it into the SDK's tool-call objects.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from PIL import Image

from k3desk.core.app.tool_settings import tool_snippets
from k3desk.core.chat.client import ChatClient, ChatEndpoint
from k3desk.core.chat.kept_state import body_next_prefix, render_body
from k3desk.core.engines.anthropic_shape import anthropic_to_oai
from k3desk.core.engines.launch import prepare_launch
from k3desk.core.engines.responses_shape import responses_to_oai
from k3desk.core.engines.supervisor import Supervisor
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths
from k3desk.core.planning.model import PlanOptions
from k3desk.devtools.tinyk3 import TinyModel
from tests.fixtures.hardware import HARDWARE_DIR

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SEED = 7
GREEDY: dict[str, Any] = {"seed": SEED, "temperature": 0.0, "top_k": 1}
THINKING_OFF: dict[str, Any] = {"chat_template_kwargs": {"thinking": False}}
HI: Any = [{"role": "user", "content": "Say hello."}]

WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME: dict[str, Any] = {
    "name": "get_time",
    "description": "The time in a city now.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
OPENAI_TOOLS: Any = [{"type": "function", "function": WEATHER}]
# the start of an answer that calls get_weather, in Kimi-K3's markup (the chat template's
# render_assistant; common/parsers/kimi-k3.cpp reads it back)
K3_CALL = (
    '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
    '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
    "<|close|>call<|sep|><|close|>tools<|sep|>"
)


@dataclass(frozen=True)
class Served:
    """The endpoint, and SDK clients set up for it as a person would."""

    url: str
    key: str
    log: Path
    model: TinyModel
    opened: list[openai.OpenAI | anthropic.Anthropic] = field(default_factory=list)

    def openai(self, key: str | None = None) -> openai.OpenAI:
        client = openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=key or self.key, max_retries=0, timeout=120
        )
        self.opened.append(client)
        return client

    def anthropic(self, key: str | None = None) -> anthropic.Anthropic:
        client = anthropic.Anthropic(
            base_url=self.url, api_key=key or self.key, max_retries=0, timeout=120
        )
        self.opened.append(client)
        return client


@pytest.fixture(scope="module")
def served(
    llama_server: Path, tiny_k3: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One engine for the module (the SDK calls do not change it), in a home of its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("K3DESK_HOME", str(tmp_path_factory.mktemp("sdk-home")))
        paths = default_paths()
        hw = HardwareProfile.from_json_file(HARDWARE_DIR / "no-gpu-laptop-32GB.json")
        prepared = prepare_launch(
            tiny_k3.first_part,
            mmproj=tiny_k3.mmproj,
            hardware=hw,
            options=PlanOptions(ctx=2048),
            paths=paths,
            engine=llama_server,
        )
        sup = Supervisor(prepared.spec(), paths)
        sup.start()
        try:
            ep = sup.wait_ready(90)
            assert sup.log_file is not None
            yield Served(ep.url, ep.api_key, sup.log_file, tiny_k3)
        finally:
            sup.stop()


@pytest.fixture(autouse=True)
def close_clients(served: Served) -> Iterator[None]:
    yield
    while served.opened:
        served.opened.pop().close()


def prefilled() -> Any:
    """A question about the weather, and the start of an answer calling get_weather."""
    return [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": K3_CALL},
    ]


def png_data_url() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 40, 40)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


# ---------------------------------------------------------------- OpenAI: models, chat


def test_models_list_names_the_loaded_model(served: Served) -> None:
    models = served.openai().models.list()
    # llama-server names a model by the path it loaded (k3desk passes no --alias)
    assert [m.id for m in models.data] == [str(served.model.first_part)]


def test_chat_completions_answers_and_streams_the_same_tokens(served: Served) -> None:
    client = served.openai()
    whole = client.chat.completions.create(
        model="k3", messages=HI, max_tokens=8, extra_body={**GREEDY, **THINKING_OFF}
    )
    choice = whole.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("length", "stop")
    assert whole.usage is not None
    assert 0 < whole.usage.completion_tokens <= 8
    assert whole.usage.prompt_tokens > 0

    stream = client.chat.completions.create(
        model="k3",
        messages=HI,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={**GREEDY, **THINKING_OFF},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert text == choice.message.content  # the deltas assemble into the same answer
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_thinking_is_turned_off_through_the_template_kwargs(served: Served) -> None:
    client = served.openai()

    def ask(thinking: bool) -> dict[str, Any]:
        answer = client.chat.completions.create(
            model="k3",
            messages=HI,
            max_tokens=8,
            extra_body={**GREEDY, "chat_template_kwargs": {"thinking": thinking}},
        )
        return answer.choices[0].message.model_dump()

    on, off = ask(True), ask(False)
    # thinking on: the template opens a think section and the words land in
    # reasoning_content (llama-server's extra field); off: straight to the answer
    assert on.get("reasoning_content")
    assert not off.get("reasoning_content")
    assert off["content"]


def test_an_image_in_a_message_reaches_the_model(served: Served) -> None:
    client = served.openai()

    def prompt_tokens(content: Any) -> int:
        answer = client.chat.completions.create(
            model="k3",
            messages=[{"role": "user", "content": content}],
            max_tokens=2,
            extra_body={**GREEDY, **THINKING_OFF},
        )
        assert answer.usage is not None
        return answer.usage.prompt_tokens

    text = {"type": "text", "text": "What is this?"}
    image = {"type": "image_url", "image_url": {"url": png_data_url()}}
    # the tiny projector: 32 px images in 8 px patches, (32/8)^2 = 16 embeddings
    assert prompt_tokens([text, image]) - prompt_tokens([text]) >= 16


# ---------------------------------------------------------------- OpenAI: tool calls


def test_a_required_tool_call_comes_back_as_tool_calls(served: Served) -> None:
    client = served.openai()
    messages = prefilled()
    answer = client.chat.completions.create(
        model="k3",
        messages=messages,
        tools=OPENAI_TOOLS,
        tool_choice="required",
        max_tokens=4,
        extra_body={**GREEDY, **THINKING_OFF},
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id

    # the call and the tool's result go back (the template renders both), and the
    # conversation carries on
    history: Any = [
        messages[0],
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear", "c": 21}'},
    ]
    follow = client.chat.completions.create(
        model="k3",
        messages=history,
        tools=OPENAI_TOOLS,
        max_tokens=4,
        extra_body={**GREEDY, **THINKING_OFF},
    )
    assert follow.usage is not None
    assert answer.usage is not None
    assert follow.usage.prompt_tokens > answer.usage.prompt_tokens


def test_a_streamed_tool_call_assembles(served: Served) -> None:
    stream = served.openai().chat.completions.create(
        model="k3",
        messages=prefilled(),
        tools=OPENAI_TOOLS,
        tool_choice="required",
        max_tokens=4,
        stream=True,
        extra_body={**GREEDY, **THINKING_OFF},
    )
    name, arguments, finish = "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                if delta.function is not None:
                    name += delta.function.name or ""
                    arguments += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert name == "get_weather"
    assert json.loads(arguments) == {"city": "Paris"}
    assert finish == "tool_calls"


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("calls", [1, 2])
def test_an_answer_calling_tools_is_kept_up_to_where_its_results_begin(
    served: Served, calls: int, thinking: bool
) -> None:
    """What a tool's conversation is kept as, after an answer calling tools (the engine's
    own call, as the SDK gives it), is where the engine's prompt for the next request (the
    calls' results sent back) begins, token for token in the engine's own tokenizer: so
    the state restored is read on from, never read again (K3's KDA layers cannot step
    back)."""
    call = served.openai().chat.completions.create(
        model="k3", messages=prefilled(), tools=OPENAI_TOOLS, tool_choice="required",
        max_tokens=4, extra_body={**GREEDY, **THINKING_OFF},
    ).choices[0].message.tool_calls[0]  # type: ignore[index]  # fmt: skip
    said = [call.model_dump()]
    if calls == 2:
        said.append({**said[0], "id": said[0]["id"] + "b"})
    options = {"tools": OPENAI_TOOLS, "chat_template_kwargs": {"thinking": thinking}}
    body = {"messages": prefilled()[:1], **options}
    with ChatClient(ChatEndpoint(served.url, served.key)) as client:
        # the message as the front reads it off the wire and the tool sends it back
        answer = {"role": "assistant", "content": "", "tool_calls": said}
        prefix = body_next_prefix(client, body, answer).text
        results = [{"role": "tool", "tool_call_id": c["id"], "content": f"Sunny {i}."}
                   for i, c in enumerate(said)]  # fmt: skip
        sent_back = {"role": "assistant", "content": None, "tool_calls": said}
        next_prompt = render_body(client, {**body, "messages": [*body["messages"], sent_back,
                                                                *results]})  # fmt: skip

        def tokens(text: str) -> list[int]:
            status, got = client.call("POST", "/tokenize", {"content": text, "parse_special": True})
            assert status == 200
            return list(got["tokens"])

        assert next_prompt.startswith(prefix)
        assert next_prompt[len(prefix) :].startswith("Sunny 0.")
        assert 'tool="get_weather"' in prefix[-60:]  # up to the first result's own words
        kept = tokens(prefix)
        assert tokens(next_prompt)[: len(kept)] == kept


def test_a_named_tool_choice_is_not_forced(served: Served) -> None:
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    dropped = "Wrong type supplied for parameter 'tool_choice'"  # server-common.h json_value

    def count() -> int:
        return served.log.read_text(errors="replace").count(dropped)

    before = count()
    answer = served.openai().chat.completions.create(
        model="k3",
        messages=prefilled()[:1],
        tools=OPENAI_TOOLS,
        tool_choice=named,
        max_tokens=4,
        extra_body={**GREEDY, **THINKING_OFF},
    )
    # accepted and answered, but as "auto": the engine logs that it dropped the object
    # (its logger writes from a thread of its own: allow it a moment)
    assert answer.choices[0].finish_reason in ("length", "stop", "tool_calls")
    deadline = time.monotonic() + 10
    while count() == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert count() == before + 1


# ---------------------------------------------------------------- OpenAI: Responses


def test_responses_answers_and_streams(served: Served) -> None:
    client = served.openai()
    whole = client.responses.create(
        model="k3", input="Say hello.", max_output_tokens=8, extra_body={**GREEDY, **THINKING_OFF}
    )
    assert whole.status == "completed"
    assert [item.type for item in whole.output] == ["message"]
    assert whole.output_text
    assert whole.usage is not None
    assert 0 < whole.usage.output_tokens <= 8

    events = list(
        client.responses.create(
            model="k3",
            input="Say hello.",
            max_output_tokens=8,
            stream=True,
            extra_body={**GREEDY, **THINKING_OFF},
        )
    )
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.output_text == whole.output_text


RESPONSES_TOOLS: Any = [{"type": "function", **WEATHER}]
REASONING: Any = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [],
    "encrypted_content": "",
    "content": [{"type": "reasoning_text", "text": "Look it up."}],
}
SAID: Any = {
    "type": "message",
    "role": "assistant",
    "id": "msg_1",
    "status": "completed",
    "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}],
}
CALLED: Any = [
    {
        "type": "function_call",
        "id": f"fc_{i}",
        "call_id": f"call_{i}",
        "name": "get_weather",
        "arguments": json.dumps({"city": city}),
    }
    for i, city in ((1, "Paris"), (2, "Nice"))
]
AGAIN: Any = {"role": "user", "content": "Again."}
# Responses requests of every shape the engine turns (server-chat.cpp): text input and
# instructions, developer and user parts, an answer's items sent back (its reasoning, its
# message, two messages in a row, calls and their outputs as text and as parts), function
# tools beside one it leaves out, strict given or not, reasoning effort, template options
RESPONSES_BODIES: list[Any] = [
    {"input": "Say hello.", "instructions": "Be brief.", "reasoning": {"effort": "high"}},
    {"input": [{"role": "developer", "content": "Be brief."},
               {"role": "user", "content": [{"type": "input_text", "text": "One, "},
                                            {"type": "input_text", "text": "two."}]}]},
    {"input": [HI[0], REASONING, SAID, AGAIN]},
    {"input": [HI[0], SAID, SAID, AGAIN], "reasoning": {"effort": "none"}},
    {"input": [HI[0], REASONING, SAID, *CALLED,
               {"type": "function_call_output", "call_id": "call_1", "output": "Sunny."},
               {"type": "function_call_output", "call_id": "call_2",
                "output": [{"type": "input_text", "text": "Rain"},
                           {"type": "input_text", "text": "."}]}],
     "tools": [*RESPONSES_TOOLS, {"type": "web_search"}], "tool_choice": "required"},
    {"input": [HI[0], CALLED[0], {"type": "function_call_output", "call_id": "call_1",
                                  "output": "Sunny."}],
     "tools": [{**RESPONSES_TOOLS[0], "strict": False}],
     "chat_template_kwargs": {"thinking": False}},
]  # fmt: skip


def _renders_as_the_engine_counts(
    served: Served, turned: dict[str, Any], count_path: str, body: dict[str, Any]
) -> None:
    """k3desk's rendering of ``turned`` (a request in the Chat Completions shape) has as
    many tokens as the engine's own count of the request ``body`` it was turned from."""
    with ChatClient(ChatEndpoint(served.url, served.key)) as client:
        prompt = render_body(client, turned)
        status, got = client.call("POST", "/tokenize", {"content": prompt, "parse_special": True})
        assert status == 200
        status, counted = client.call("POST", count_path, {**body, "model": "k3"})
        assert status == 200
        assert len(got["tokens"]) == counted["input_tokens"]


def _options(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A request's fields for an SDK call, and what goes in its ``extra_body``."""
    options = {k: v for k, v in body.items() if k != "chat_template_kwargs"}
    return options, {**GREEDY, **{k: v for k, v in body.items() if k == "chat_template_kwargs"}}


def _chat_right_after(served: Served, turned: dict[str, Any], extra: dict[str, Any]) -> Any:
    """``turned`` sent as Chat Completions right after the request it was turned from: its
    prompt must be the same, all of it read from what that request left in the slot but
    the last 4 tokens (the engine's checkpoint before a prompt's end, server-context.cpp).
    The assistant's message."""
    fields = ("messages", "tools", "tool_choice", "reasoning_effort")
    done = served.openai().chat.completions.create(
        model="k3", max_tokens=6, extra_body=extra, **{k: turned[k] for k in fields if k in turned}
    )
    assert done.model_extra["timings"]["prompt_n"] <= 4, done.model_extra["timings"]
    return done.choices[0].message


@pytest.mark.parametrize("body", RESPONSES_BODIES)
def test_responses_are_turned_into_the_prompt_the_engine_builds(
    served: Served, body: dict[str, Any]
) -> None:
    """The prompt k3desk renders for a Responses request (to keep and restore a tool's
    conversation) is the engine's: as many tokens as its own count of that request, and,
    sent as Chat Completions right after the Responses request, read from the engine's
    cache as the same prompt, with the same answer (greedy)."""
    turned = responses_to_oai({**body, "model": "k3"})
    assert turned is not None
    _renders_as_the_engine_counts(served, turned, "/v1/responses/input_tokens", body)
    options, extra = _options(body)
    asked = served.openai().responses.create(
        model="k3", max_output_tokens=6, extra_body=extra, **options
    )
    said = _chat_right_after(served, turned, extra)
    assert asked.output_text == (said.content or "")
    assert [(i.name, i.arguments) for i in asked.output if i.type == "function_call"] == [
        (c.function.name, c.function.arguments) for c in said.tool_calls or ()
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"input": [{"role": "assistant", "content": "An easy message the engine cannot place."}]},
        {"input": "Hi", "previous_response_id": "resp_1"},
        {"input": 5},
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        {"input": [{"type": "reasoning", "summary": [], "content": []}]},
        {"input": "Hi", "tools": {"type": "function"}},
        {"instructions": "No input."},
    ],
)
def test_a_responses_request_the_engine_refuses_is_not_kept(
    served: Served, body: dict[str, Any]
) -> None:
    """What the engine answers 400 to, k3desk does not turn into a conversation to keep."""
    assert responses_to_oai({**body, "model": "k3"}) is None
    with ChatClient(ChatEndpoint(served.url, served.key)) as client:
        status, _ = client.call("POST", "/v1/responses", {**body, "model": "k3"})
    assert status == 400


# ---------------------------------------------------------------- Anthropic Messages


def test_anthropic_messages_answer_and_stream(served: Served) -> None:
    client = served.anthropic()
    whole = client.messages.create(
        model="k3", max_tokens=8, messages=HI, extra_body={**GREEDY, **THINKING_OFF}
    )
    assert whole.role == "assistant"
    assert [block.type for block in whole.content] == ["text"]
    assert whole.stop_reason in ("max_tokens", "end_turn")
    assert 0 < whole.usage.output_tokens <= 8
    text = whole.content[0].text  # type: ignore[union-attr]
    assert text

    with client.messages.stream(
        model="k3", max_tokens=8, messages=HI, extra_body={**GREEDY, **THINKING_OFF}
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text
    assert final.usage.output_tokens == whole.usage.output_tokens


BILLING = "x-anthropic-billing-header: cc_version=2.1; cch=%s; cc_entrypoint=cli"
ANTHROPIC_TOOLS: Any = [
    {"name": "get_weather", "description": "The weather.", "input_schema": WEATHER["parameters"]}
]
# Messages requests of every shape the engine turns (server-chat.cpp): system as text and as
# blocks (a client's billing header in it), text blocks, thinking, tool uses with their
# results (text, blocks, none), tools and each tool choice, template options
MESSAGES: list[Any] = [
    {"system": "Be brief.", "messages": HI},
    {"system": [{"type": "text", "text": BILLING % "1a2b3"}, {"type": "text", "text": " Hi."}],
     "messages": HI},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "One, "},
                                               {"type": "text", "text": "two."}]}]},
    {"messages": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Look it up.", "signature": ""},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "c1", "name": "get_weather",
             "input": {"city": "Paris", "days": 2, "é": [True, None]}},
            {"type": "tool_use", "id": "c2", "name": "get_weather", "input": {"city": "Nice"}},
            {"type": "tool_use", "id": "c3", "name": "get_weather"}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "Sunny."},
            {"type": "tool_result", "tool_use_id": "c2",
             "content": [{"type": "text", "text": "Rain"}, {"type": "text", "text": "."}]},
            {"type": "tool_result", "tool_use_id": "c3"},
            {"type": "text", "text": "And tomorrow?"}]}],
     "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any"}},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant"},
                  {"role": "user", "content": "Again"}],
     "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "auto"},
     "chat_template_kwargs": {"thinking": False}},
]  # fmt: skip


@pytest.mark.parametrize("body", MESSAGES)
def test_messages_are_turned_into_the_prompt_the_engine_builds(
    served: Served, body: dict[str, Any]
) -> None:
    """The prompt k3desk renders for a Messages request (to keep and restore a tool's
    conversation) is the engine's: as many tokens as its own count of that request, and,
    sent as Chat Completions right after the Messages request, read from the engine's
    cache as the same prompt, with the same answer (greedy)."""
    turned = anthropic_to_oai({**body, "model": "k3", "max_tokens": 4})
    _renders_as_the_engine_counts(
        served, turned, "/v1/messages/count_tokens", {**body, "max_tokens": 4}
    )
    options, extra = _options(body)
    asked = served.anthropic().messages.create(
        model="k3", max_tokens=6, extra_body=extra, **options
    )
    said = _chat_right_after(served, turned, extra)
    assert [b.text for b in asked.content if b.type == "text"] == (
        [said.content] if said.content else []
    )
    assert [(b.name, b.input) for b in asked.content if b.type == "tool_use"] == [
        (c.function.name, json.loads(c.function.arguments)) for c in said.tool_calls or ()
    ]


def test_anthropic_tool_choice_forces_a_tool_but_not_the_one_named(served: Served) -> None:
    def tool(spec: dict[str, Any]) -> Any:
        return {
            "name": spec["name"],
            "description": spec["description"],
            "input_schema": spec["parameters"],
        }

    answer = served.anthropic().messages.create(
        model="k3",
        max_tokens=4,
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": K3_CALL},
        ],
        tools=[tool(WEATHER), tool(TIME)],
        tool_choice={"type": "tool", "name": "get_time"},
        extra_body={**GREEDY, **THINKING_OFF},
    )
    assert answer.stop_reason == "tool_use"
    uses = [block for block in answer.content if block.type == "tool_use"]
    assert len(uses) == 1
    # "get_time" was named, yet the call the model began (get_weather) stands: the
    # engine turned the choice into "required"
    assert uses[0].name == "get_weather"
    assert uses[0].input == {"city": "Paris"}
    assert uses[0].id


# ---------------------------------------------------------------- keys


def test_a_wrong_key_is_refused_with_the_sdks_authentication_error(served: Served) -> None:
    with pytest.raises(openai.AuthenticationError):
        served.openai(key="not-the-key").models.list()
    with pytest.raises(openai.AuthenticationError):
        served.openai(key="not-the-key").chat.completions.create(
            model="k3", messages=HI, max_tokens=1
        )
    with pytest.raises(anthropic.AuthenticationError):
        served.anthropic(key="not-the-key").messages.create(model="k3", max_tokens=1, messages=HI)


# ---------------------------------------------------------------- the settings k3desk shows


def test_the_settings_k3desk_offers_to_copy_work_as_pasted(served: Served, tmp_path: Path) -> None:
    """The Engine page's "Copy for..." texts, run as a person would paste them: each
    one gets an answer from the engine (a short one: the tiny model stops nowhere)."""
    snippets = {s.label: s.text for s in tool_snippets(served.url, served.key, max_tokens=4)}
    assert set(snippets) == {"curl", "OpenAI SDK (Python)", "Anthropic SDK (Python)"}
    for label, text in snippets.items():
        if label == "curl":
            run = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, run.stderr
            answer = json.loads(run.stdout)
            assert answer["object"] == "chat.completion"
            assert answer["usage"]["completion_tokens"] > 0
            continue
        script = tmp_path / "snippet.py"
        script.write_text(text)
        run = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, f"{label}:\n{text}\n{run.stderr}"
    # a wrong key in the same text is refused: the key in it is the one that counts
    wrong = tool_snippets(served.url, "not-the-key", max_tokens=4)[1].text
    script = tmp_path / "wrong.py"
    script.write_text(wrong)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "AuthenticationError" in run.stderr
