"""Texts the shells show in small places (a table cell, a link, a heading), computed
without Qt so that both shells say the same and tests read them without a window."""

from __future__ import annotations

from pathlib import Path


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


def shown_path(path: Path, home: Path | None = None) -> str:
    """``path`` as a person reads it: under the home folder as ``~/...``."""
    home = Path.home() if home is None else home
    try:
        return str(Path("~") / path.relative_to(home))
    except ValueError:
        return str(path)


def model_where(shard: Path, source: str, origin: Path) -> tuple[str, str]:
    """My models' "Where" cell (text, tooltip): the folder the model's files are in, and
    how it came to the list (added by hand, or found in a model folder of Settings)."""
    folder = shown_path(shard.parent)
    if source == "added":
        return folder, f"{shard.parent}\nAdded by hand: {origin}"
    return folder, f"{shard.parent}\nFound in the model folder {origin} (Settings)"
