"""Switching the model that runs: what the question says before one is stopped for
another (the model running, the new one, and how long the new one takes to load by its
plan).  The desktop app asks it; nothing here stops or starts anything."""

from __future__ import annotations

from typing import TYPE_CHECKING

from k3desk.core.app.cells import shown_path
from k3desk.core.units import fmt_duration

if TYPE_CHECKING:
    from pathlib import Path

    from k3desk.core.planning.model import LaunchPlan


def load_time_text(plan: LaunchPlan | None) -> str:
    """How long a model takes to load by its plan ("" when unplanned)."""
    if plan is None or plan.load_seconds <= 0:
        return ""
    return f"up to {fmt_duration(plan.load_seconds)}"


def switch_names(
    old: str, new: str, old_shard: Path | None, new_shard: Path | None
) -> tuple[str, str]:
    """The two models as the question names them: where they share a name, each with its
    folder (or, in one folder, its file), so "Stop X and load X" is never asked."""
    if not old or old != new or old_shard is None or new_shard is None:
        return old, new
    if old_shard.parent != new_shard.parent:
        return f"{old} ({shown_path(old_shard.parent)})", f"{new} ({shown_path(new_shard.parent)})"
    return f"{old} ({old_shard.name})", f"{new} ({new_shard.name})"


def switch_question(
    old: str, new: str, ready: bool, plan: LaunchPlan | None, pictures: int = 0
) -> tuple[str, str]:
    """The question and what it costs, as the person reads them.  ``pictures``: how many
    pictures the open conversation holds that the new model, which has no vision, would
    not be sent if the conversation is continued on it (:mod:`k3desk.core.app.chat_turn`)."""
    old = old or "The model running now"
    new = new or "the new model"
    doing = "is loaded" if ready else "is loading"
    load = load_time_text(plan)
    takes = f" {new} takes {load} to load." if load else ""
    what, it = ("its picture", "it") if pictures == 1 else (f"its {pictures} pictures", "them")
    blind = (
        f" Continued, the conversation keeps {what}, but {new} has no vision and is not "
        f"sent {it}."
        if pictures
        else ""
    )
    return (
        f"{old} {doing}. Stop it and load {new}?",
        f"{old} stops now.{takes} {new} starts a new conversation; the one open now stays "
        f"in the list. Continue it instead to keep talking there.{blind}",
    )
