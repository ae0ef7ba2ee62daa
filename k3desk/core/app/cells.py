"""Texts the shells show in small places (a table cell, a link, a heading), computed
without Qt so that both shells say the same and tests read them without a window."""

from __future__ import annotations


def plural(n: int, noun: str, nouns: str = "") -> str:
    """``1 word``, ``2 words`` (``nouns``: the plural where adding an s is wrong)."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def reasoning_title(reasoning: str, thinking: bool) -> str:
    """The heading of an answer's reasoning: "Thinking… (12 words)" while it streams."""
    words = len(reasoning.split())
    return f"{'Thinking…' if thinking else 'Reasoning'} ({plural(words, 'word')})"


def only_reasoning(content: str, reasoning: str, streaming: bool) -> bool:
    """True for a finished answer that is nothing but reasoning: the model ended (or was
    stopped) before writing the answer itself, so the reasoning is the answer shown."""
    return not streaming and not content.strip() and bool(reasoning.strip())


ONLY_REASONING_NOTE = (
    "Kimi-K3 ended with its reasoning and wrote no answer after it (a token limit, a stop "
    "sequence or Stop can end it there). Regenerate to ask again."
)
