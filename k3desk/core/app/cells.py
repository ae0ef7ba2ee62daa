"""Texts the shells show in small places (a table cell, a link, a heading), computed
without Qt so that both shells say the same and tests read them without a window."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.units import fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.shardplan import MemoryRow


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


def no_text(content: str, reasoning: str, streaming: bool) -> bool:
    """True for a finished answer with nothing in it at all: the model ended at once (its
    first token was an end-of-generation token), or wrote only white space."""
    return not streaming and not content.strip() and not reasoning.strip()


NO_TEXT_NOTE = (
    "Kimi-K3 ended this answer without writing anything (its first token ended the turn). "
    "Regenerate to ask again."
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


MEMORY_TIPS = {
    "Budget": "What the plan may use of this device (after its safety margin)",
    "Weights": "The model's tensors placed here",
    "KV cache": "The context's KV cache and the KDA layers' state",
    "Compute": "llama.cpp's compute buffers (and the logits on the device that holds them)",
    "Projector": "The vision projector (--mmproj) and its compute buffer",
    "Used": "Everything above, added up",
    "Left": "Budget minus Used (negative: over the budget)",
}


def memory_columns(rows: Sequence[MemoryRow]) -> tuple[str, ...]:
    """The Engine page's memory table's columns: every part that makes up "Used" has
    one (a projector's only when the plan has one)."""
    parts = ["Device", "Budget", "Weights", "KV cache", "Compute"]
    if any(r.other for r in rows):
        parts.append("Projector")
    return (*parts, "Used", "Left")


def memory_cells(row: MemoryRow, columns: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """``row`` under ``columns`` (:func:`memory_columns`): (text, bytes; 0 for the name)."""
    values = {
        "Budget": row.budget,
        "Weights": row.weights,
        "KV cache": row.cache_and_state,
        "Compute": row.compute,
        "Projector": row.other,
        "Used": row.used,
        "Left": row.free,
    }
    return tuple(
        (row.device, 0) if c == "Device" else (fmt_bytes(values[c]), values[c]) for c in columns
    )


def pick_mark(picked: bool, fits: bool) -> str:
    """The mark before a tier's name: ★ the recommendation (it fits), ☆ the closest
    option when nothing fits (preselected, not recommended), else nothing."""
    if not picked:
        return ""
    return "★ " if fits else "☆ "


PICK_TIPS = {
    "★ ": "Recommended: the best tier that fits this machine (its download fits the free "
    "disk, when any does).",
    "☆ ": "The closest option: nothing fits in this machine's memory, and this one misses "
    "it by the least (of the tiers whose download fits the free disk, when any does).",
}
