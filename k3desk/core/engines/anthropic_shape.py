"""Anthropic Messages requests and answers in the Chat Completions shape, as llama-server
reads them.

llama-server b11434 answers ``/v1/messages`` by turning the request into a Chat Completions
one (``server_chat_convert_anthropic_to_oai``, tools/server/server-chat.cpp) and building
the prompt from that; its ``/apply-template`` takes the Chat Completions shape only.  So
to render the prompt a Messages request makes (what a tool's conversation is kept and
restored by), the request is turned the same way here: :func:`anthropic_to_oai` follows
that function for every field the prompt depends on (the system text, each message's
text, thinking, pictures, tool uses and tool results, the tools and the tool choice).  An
answer (``to_json_anthropic``, tools/server/server-task.cpp: thinking, then text, then a
``tool_use`` block per call; streamed as ``content_block_start``/``content_block_delta``
events) is read back into the assistant's message the tool will send back
(:func:`anthropic_answer`).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["anthropic_answer", "anthropic_to_oai", "streamed_anthropic_answer"]

BILLING = "x-anthropic-billing-header:"


def _billing_normalized(text: str) -> str:
    """A client's billing header in its system text, its per-request ``cch=`` value made
    constant (``normalize_anthropic_billing_header``: else every request's prompt differs)."""
    if not text.startswith(BILLING):
        return text
    at = text.find("cch=", len(BILLING))
    if at < 0:
        return text
    at += 4
    if at + 5 < len(text) and text[at + 5] == ";":
        return text[:at] + "fffff" + text[at + 5 :]
    return text


def _get(d: Any, key: str, default: Any) -> Any:
    """``json_value``: the field where it has the default's type, else the default."""
    v = d.get(key, default) if isinstance(d, dict) else default
    return v if isinstance(v, type(default)) else default


def _dump(value: Any) -> str:
    """nlohmann::json's ``dump()``: compact, keys in order, UTF-8 as it is."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _picture(source: Any) -> dict[str, Any] | None:
    kind = _get(source, "type", "")
    if kind == "base64":
        url = f"data:{_get(source, 'media_type', 'image/jpeg')};base64,{_get(source, 'data', '')}"
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "url":
        return {"type": "image_url", "image_url": {"url": _get(source, "url", "")}}
    return None


def _tool_result(block: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"role": "tool", "tool_call_id": _get(block, "tool_use_id", "")}
    content = block.get("content")
    if isinstance(content, str):
        return {**result, "content": content}
    if not isinstance(content, list):
        return {**result, "content": ""}
    text, parts, pictures = "", [], False
    for c in content:
        if _get(c, "type", "") == "text":
            text += _get(c, "text", "")
            parts.append({"type": "text", "text": _get(c, "text", "")})
        elif _get(c, "type", "") == "image":
            pictures = True
            picture = _picture(_get(c, "source", {}))
            if picture is not None:
                parts.append(picture)
    return {**result, "content": parts if pictures else text}


def _message(msg: Any) -> list[Any]:
    """One Messages message as the Chat Completions messages it becomes."""
    role = _get(msg, "role", "")
    if not isinstance(msg, dict) or "content" not in msg:
        return [] if role == "assistant" else [msg]
    content = msg["content"]
    if not isinstance(content, list):
        return [msg]
    calls: list[dict[str, Any]] = []
    parts: list[Any] = []
    results: list[dict[str, Any]] = []
    thinking = ""
    for block in content:
        kind = _get(block, "type", "")
        if kind == "text":
            parts.append(block)
        elif kind == "thinking":
            thinking += _get(block, "thinking", "")
        elif kind == "image":
            picture = _picture(_get(block, "source", {}))
            if picture is not None:
                parts.append(picture)
        elif kind == "tool_use":
            arguments = _dump(_get(block, "input", {}))
            calls.append({"id": _get(block, "id", ""), "type": "function",
                          "function": {"name": _get(block, "name", ""),
                                       "arguments": arguments}})  # fmt: skip
        elif kind == "tool_result":
            results.append(_tool_result(block))
    out: list[Any] = []
    if parts or calls or thinking:
        new: dict[str, Any] = {"role": role, "content": parts or ""}
        if calls:
            new["tool_calls"] = calls
        if thinking:
            new["reasoning_content"] = thinking
        out.append(new)
    return out + results


def anthropic_to_oai(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions fields a Messages request's prompt is built from (messages,
    tools, tool_choice, chat_template_kwargs), as the engine turns them."""
    messages: list[Any] = []
    system = body.get("system")
    if isinstance(system, str):
        messages.append({"role": "system", "content": _billing_normalized(system)})
    elif isinstance(system, list):
        text = "".join(_billing_normalized(_get(b, "text", "")) for b in system
                       if _get(b, "type", "") == "text")  # fmt: skip
        messages.append({"role": "system", "content": text})
    elif system is not None:
        messages.append({"role": "system", "content": ""})
    for msg in body.get("messages") or []:
        messages.extend(_message(msg))
    out: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [
            {"type": "function", "function": {
                "name": _get(t, "name", ""), "description": _get(t, "description", ""),
                "parameters": t.get("input_schema", {}) if isinstance(t, dict) else {}}}
            for t in tools
        ]  # fmt: skip
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = _get(choice, "type", "")
        if kind == "auto":
            out["tool_choice"] = "auto"
        elif kind in ("any", "tool"):
            out["tool_choice"] = "required"
    if "chat_template_kwargs" in body:
        out["chat_template_kwargs"] = body["chat_template_kwargs"]
    return out


def _assistant(blocks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The answer's content blocks as the tool sends them back, in the Chat Completions
    shape the engine turns them into."""
    said = _message({"role": "assistant", "content": blocks})
    if not said:
        return {"role": "assistant", "content": ""}
    return said[0] if isinstance(said[0], dict) else None


def anthropic_answer(answer: Any) -> dict[str, Any] | None:
    """A Messages answer (not streamed) as the assistant's message; None where it is none."""
    blocks = answer.get("content") if isinstance(answer, dict) else None
    if not isinstance(blocks, list) or not answer.get("stop_reason"):
        return None
    return _assistant(blocks)


def streamed_anthropic_answer(body: bytes) -> dict[str, Any] | None:
    """A streamed Messages answer's events as the assistant's message; None where the
    stream did not say why it stopped (``message_delta``)."""
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    stopped = False
    for line in body.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        event = json.loads(line[5:])
        kind = event.get("type")
        if kind == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif kind == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif delta.get("type") == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "message_delta":
            stopped = stopped or bool((event.get("delta") or {}).get("stop_reason"))
    if not stopped:
        return None
    for i, text in partial.items():
        blocks[i]["input"] = json.loads(text)
    return _assistant([blocks[i] for i in sorted(blocks)])
