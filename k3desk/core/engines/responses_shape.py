"""OpenAI Responses requests and answers in the Chat Completions shape, as llama-server
reads them.

llama-server b11434 answers ``/v1/responses`` (and ``/responses``) by turning the request
into a Chat Completions one (``server_chat_convert_responses_to_chatcmpl``,
tools/server/server-chat.cpp) and building the prompt from that, as it does for its own
token count (``/v1/responses/input_tokens``).  So to render the prompt a Responses request
makes (what a tool's conversation is kept and restored by), the request is turned the same
way here: :func:`responses_to_oai` follows that function item by item, and refuses (None)
what the engine refuses, so that nothing is kept for a request the engine answered with
an error.

An answer (``to_json_oaicompat_resp`` and ``to_json_oaicompat_resp_stream``,
tools/server/server-task.cpp) lists its output items: a ``reasoning`` item, a
``message`` item, a ``function_call`` item per call; streamed, the whole list comes in
the ``response.completed`` event.  A client sends those items back in its next request's
``input`` (the Responses API has no other way to a stateless conversation: the engine
refuses ``previous_response_id``), so the answer is read back by the same conversion
(:func:`responses_answer`, :func:`streamed_responses_answer`).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["responses_answer", "responses_to_oai", "streamed_responses_answer"]

CALL_FIELDS = ("arguments", "call_id", "name")


class _Refused(ValueError):
    """What the engine answers 400 to (its ``std::invalid_argument``)."""


def _is(item: Any, key: str, kind: type) -> bool:
    """``exists_and_is_string`` / ``exists_and_is_array``."""
    return isinstance(item, dict) and isinstance(item.get(key), kind)


def _get(d: Any, key: str, default: Any) -> Any:
    """``json_value``: the field where it has the default's type, else the default."""
    v = d.get(key, default) if isinstance(d, dict) else default
    return v if isinstance(v, type(default)) else default


def _input_message(item: dict[str, Any]) -> dict[str, Any]:
    """A user, system or developer message: its parts as Chat Completions parts."""
    parts: list[dict[str, Any]] = []
    for part in item["content"]:
        kind = _get(part, "type", "")
        if kind == "input_text":
            if "text" not in part:
                raise _Refused("'Input text' requires 'text'")
            parts.append({"text": part["text"], "type": "text"})
        elif kind == "input_image":
            if "image_url" not in part:
                raise _Refused("'image_url' is required")
            parts.append({"image_url": {"url": part["image_url"]}, "type": "image_url"})
        else:  # input_file, or no type the engine knows
            raise _Refused(f"'type' {kind!r} is not read by the engine")
    said = {k: v for k, v in item.items() if k not in ("type", "status")}
    return {**said, "content": parts}


def _output_parts(item: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant message item's parts (``output_text``, ``refusal``)."""
    content = item.get("content")  # text alone was made an input_text part already
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        kind = _get(part, "type", "")
        if kind in ("output_text", "input_text"):
            if not _is(part, "text", str):
                raise _Refused("'Output text' requires 'text'")
            parts.append({"text": part["text"], "type": "text"})
        elif kind == "refusal":
            if not _is(part, "refusal", str):
                raise _Refused("'Refusal' requires 'refusal'")
            parts.append({"refusal": part["refusal"], "type": "refusal"})
        else:
            raise _Refused("'type' must be one of 'output_text' or 'refusal'")
    return parts


def _tool_output(item: dict[str, Any]) -> dict[str, Any]:
    """A ``function_call_output`` item as the tool message it becomes."""
    output = item["output"]
    if isinstance(output, list):
        turned = []
        for part in output:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "input_text":
                turned.append({**part, "type": "text"})
            elif kind == "input_image" and "image_url" in part:
                url = {"url": part["image_url"]}
                turned.append({**part, "type": "image_url", "image_url": url})
            else:
                raise _Refused("Output of tool call should be 'Input text' or 'Input image'")
        output = turned
    return {"content": output, "role": "tool", "tool_call_id": item["call_id"]}


def _item(messages: list[dict[str, Any]], item: Any) -> None:
    """One input item added to ``messages`` as the engine adds it: an assistant's items
    (its reasoning, its message, its calls) merged into the assistant message before."""
    last = messages[-1] if messages else None
    merge = last is not None and last.get("role") == "assistant"
    if _is(item, "content", str):
        item = {**item, "content": [{"text": item["content"], "type": "input_text"}]}
    role, kind = _get(item, "role", ""), _get(item, "type", "")
    if _is(item, "content", list) and role in ("user", "system", "developer"):
        messages.append(_input_message(item))
    elif role == "assistant" and kind == "message":
        parts = _output_parts(item)
        if last is not None and merge:
            if not isinstance(last.get("content"), list):
                last["content"] = []
            last["content"].extend(parts)
        else:
            messages.append({**{k: v for k, v in item.items() if k not in ("status", "type")},
                             "content": parts})  # fmt: skip
    elif kind == "function_call" and all(_is(item, k, str) for k in CALL_FIELDS):
        call = {"function": {"arguments": item["arguments"], "name": item["name"]},
                "id": item["call_id"], "type": "function"}  # fmt: skip
        if last is not None and merge:
            if not isinstance(last.get("tool_calls"), list):
                last["tool_calls"] = []
            last["tool_calls"].append(call)
        else:
            messages.append({"role": "assistant", "tool_calls": [call]})
    elif (
        kind == "function_call_output"
        and _is(item, "call_id", str)
        and (_is(item, "output", str) or _is(item, "output", list))
    ):
        messages.append(_tool_output(item))
    elif kind == "reasoning" and _is(item, "summary", list):
        content = item.get("content")
        if not isinstance(content, list) or not content or not _is(content[0], "text", str):
            raise _Refused("a reasoning item without its text")
        if last is not None and merge:
            last["reasoning_content"] = content[0]["text"]
        else:
            messages.append({"role": "assistant", "content": [],
                             "reasoning_content": content[0]["text"]})  # fmt: skip
    else:
        raise _Refused("Cannot determine type of 'item'")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        messages.append({"role": "system", "content": _get(body, "instructions", "")})
    given = body["input"]
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            _item(messages, item)
    else:
        raise _Refused("'input' must be a string or array of objects")
    return messages


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as the engine turns it, ``strict`` added where it is not given (K3's
    template lists a tool's name, description and parameters alone, keys sorted)."""
    function = {k: v for k, v in tool.items() if k != "type"}
    function.setdefault("strict", True)
    return function


def responses_to_oai(body: Any) -> dict[str, Any] | None:
    """A Responses request as the Chat Completions request the engine turns it into (its
    messages, its function tools, ``max_tokens``, ``reasoning_effort``; every other field
    as it is), or None where the engine refuses it (400)."""
    if not isinstance(body, dict) or "input" not in body or _get(body, "previous_response_id", ""):
        return None
    try:
        messages = _messages(body)
    except _Refused:
        return None
    out = {k: v for k, v in body.items() if k not in ("input", "instructions")}
    out["messages"] = messages
    if "tools" in body:
        tools = body["tools"]
        if not isinstance(tools, list):
            return None
        functions = [{"type": "function", "function": _function(t)}
                     for t in tools if _get(t, "type", "") == "function"]  # fmt: skip
        del out["tools"]
        if functions:  # other tools (web search, files) the engine leaves out
            out["tools"] = functions
    if "max_output_tokens" in body:
        out["max_tokens"] = out.pop("max_output_tokens")
    reasoning = out.pop("reasoning", None)
    if isinstance(reasoning, dict) and "effort" in reasoning:
        out["reasoning_effort"] = reasoning["effort"]
    return out


def _assistant(output: Any) -> dict[str, Any] | None:
    """An answer's output items as the assistant's message the tool sends back (None where
    they are none: an empty answer leaves nothing to send back)."""
    if not isinstance(output, list) or not output:
        return None
    try:
        said = _messages({"input": output})
    except _Refused:
        return None
    if len(said) != 1 or said[0].get("role") != "assistant":
        return None
    return said[0]


def responses_answer(answer: Any) -> dict[str, Any] | None:
    """A Responses answer (not streamed) as the assistant's message; None where it is none
    (not completed: an error, or cut short)."""
    if not isinstance(answer, dict) or answer.get("status") != "completed":
        return None
    return _assistant(answer.get("output"))


def streamed_responses_answer(body: bytes) -> dict[str, Any] | None:
    """A streamed Responses answer's events as the assistant's message, from its
    ``response.completed`` event (None where the stream ended before it)."""
    for line in reversed(body.split(b"\n")):
        if not line.startswith(b"data:"):
            continue
        event = json.loads(line[5:])
        if isinstance(event, dict) and event.get("type") == "response.completed":
            return responses_answer(event.get("response"))
    return None
