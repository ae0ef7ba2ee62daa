"""The settings a person's own tools need for the local API, as text to paste.

llama-server b11434 answers the OpenAI routes under ``/v1`` (``/v1/chat/completions``,
``/v1/responses``, ``/v1/models``) and Anthropic's Messages at ``/v1/messages``
(``tools/server/server.cpp``), so the OpenAI SDK takes the address with ``/v1`` and the
Anthropic SDK the bare one (it adds ``/v1/messages`` itself).  Both send the key the
engine checks: OpenAI's as ``Authorization: Bearer``, Anthropic's as ``x-api-key``, which
llama-server accepts too (``server-http.cpp``).

The model name is not checked by a llama-server serving one model; the snippets say
``kimi-k3``.  Kimi-K3 thinks before it answers unless told not to: the OpenAI answer's
``content`` is the answer (the thinking comes apart, in ``reasoning_content``), and the
Anthropic answer starts with a thinking block, so the snippet prints the text blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL = "kimi-k3"
MAX_TOKENS = 1024


@dataclass(frozen=True)
class ToolSnippet:
    """One way to call the local API: a label for a menu, and the text to paste."""

    label: str
    text: str


def tool_snippets(url: str, key: str, *, max_tokens: int = MAX_TOKENS) -> tuple[ToolSnippet, ...]:
    """curl, the OpenAI Python SDK and the Anthropic Python SDK, set up for the engine at
    ``url`` (``http://127.0.0.1:PORT``, without ``/v1``) with ``key``."""
    base = url.rstrip("/").removesuffix("/v1")
    ask = '[{"role": "user", "content": "Hello"}]'
    curl = (
        f"curl {base}/v1/chat/completions \\\n"
        f'  -H "Authorization: Bearer {key}" \\\n'
        '  -H "Content-Type: application/json" \\\n'
        f'  -d \'{{"model": "{MODEL}", "max_tokens": {max_tokens}, "messages": {ask}}}\'\n'
    )
    openai_sdk = (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base}/v1", api_key="{key}")\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{MODEL}", max_tokens={max_tokens}, messages={ask}\n'
        ")\n"
        "print(reply.choices[0].message.content)\n"
    )
    anthropic_sdk = (
        "import anthropic\n\n"
        f'client = anthropic.Anthropic(base_url="{base}", api_key="{key}")\n'
        "reply = client.messages.create(\n"
        f'    model="{MODEL}", max_tokens={max_tokens}, messages={ask}\n'
        ")\n"
        'print("".join(block.text for block in reply.content if block.type == "text"))\n'
    )
    return (
        ToolSnippet("curl", curl),
        ToolSnippet("OpenAI SDK (Python)", openai_sdk),
        ToolSnippet("Anthropic SDK (Python)", anthropic_sdk),
    )
