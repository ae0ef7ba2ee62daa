"""The Models page's "My models": a row per local set, judged for the machine shown."""

from __future__ import annotations

from k3desk.core.app.cells import model_where
from k3desk.core.app.library import AddResult, ModelRow, ModelsJudgement
from k3desk.core.app.presenters import Cell, Tone
from k3desk.core.planning.recommend import FITS
from k3desk.core.units import fmt_bytes

COLUMNS = ("Model", "Verdict", "Speed", "Size", "Vision", "Tier", "Where")
VERDICT_COLUMN = 1
EMPTY = (
    "No models of your own yet. Add a .gguf file or a folder, drop one on the window, or "
    "add a model folder in Settings."
)


def verdict_tone(row: ModelRow) -> Tone:
    return "ok" if row.kind in FITS else "warn" if row.kind == "stream" else "danger"


def row_cells(row: ModelRow) -> tuple[Cell, ...]:
    """The table's cells for ``row``: what the automation hook reports too."""
    m = row.model
    tier = m.tier
    speed = (
        Cell(row.speed.text(), row.speed.details())
        if row.speed is not None
        else Cell("—", "Does not run there: no speed to predict." if m.ok else m.problem)
    )
    notes = "\n".join(m.suspicious)
    return (
        Cell(m.name, f"{m.shard}\n{m.parts} part(s)" + (f"\n{notes}" if notes else "")),
        Cell(
            row.label,
            m.problem or (row.plan.reason if row.plan is not None else ""),
            verdict_tone(row),
        ),
        speed,
        Cell(fmt_bytes(m.size_bytes), f"{m.size_bytes:,} bytes in {m.parts} part(s)"),
        Cell(
            "yes" if m.projector is not None else "no",
            str(m.projector) if m.projector is not None else "No vision projector beside it.",
        ),
        Cell(
            f"{tier.tier.name} · {tier.tier.publisher}" if tier is not None else "—",
            f"Recognised from its headers: {tier.text()}"
            if tier is not None
            else "Not a catalog tier (its headers match none).",
        ),
        Cell(*model_where(m.shard, m.source, m.origin)),
    )


def summary_text(judged: ModelsJudgement) -> str:
    """The line under the table: how many, for which machine, and the folders' problems."""
    n = len(judged.rows)
    text = (
        EMPTY
        if not n
        else f"{n} model{'s' if n != 1 else ''}, judged for {judged.subject.describe()}. "
        "Chat with it launches on this machine."
    )
    return " ".join([text, *judged.problems])


def added_text(result: AddResult) -> str:
    """What one add did, in a sentence."""
    names = ", ".join(m.name for m in result.added)
    if result.already:
        return f"{names} is already in your models."
    text = f"Added {names}."
    if result.skipped:
        text += f" Skipped {len(result.skipped)} set(s) that cannot be used."
    return text
