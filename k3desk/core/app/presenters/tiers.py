"""The published tiers table: every tier with its verdict for one machine or a cluster,
speed, size, quality, vision and engines; the pick is starred."""

from __future__ import annotations

from k3desk.core.app.cells import PICK_TIPS, pick_mark
from k3desk.core.app.cluster_tiers import ClusterTierRow
from k3desk.core.app.presenters import Cell, Tone
from k3desk.core.app.tiers import TierRow, files_note
from k3desk.core.catalog.model import Tier
from k3desk.core.planning.recommend import sentence
from k3desk.core.units import fmt_bytes

COLUMNS = ("Tier", "Verdict", "Speed", "Size", "Quality", "Vision", "Engines")
VERDICT_COLUMN = 1
SPEED_COLUMN = 2
QUALITY_COLUMN = 4
NO_CLUSTER_SPEED = "No speed prediction for a cluster: the engine reports it per answer."


def vision_text(t: Tier) -> str:
    if not t.mmproj or t.vision == "none":
        return "no"
    return "yes" if t.vision == "upstream" else "yes (fork build)"


def quality_text(t: Tier) -> tuple[str, str]:
    if not t.quality:
        return "not published", t.quality_caveat
    q = t.quality[0]
    tip = "\n".join(f"{f.metric}: {f.value} ({f.conditions})" for f in t.quality)
    if t.quality_caveat:
        tip += f"\n\nCaveat: {t.quality_caveat}"
    text = f"{q.metric} {q.value}"
    if len(text) > 34:
        text = text[:33].rstrip() + "…"
    return text + (" *" if t.quality_caveat else ""), tip


def verdict_tip(row: TierRow) -> str:
    """The verdict cell's tooltip: the plan's reason, what it needs of the machine against
    what the plan may use there, and why it is not the recommendation."""
    tv = row.verdict
    lines = [tv.reason]
    if row.kind == "hybrid" and row.n_cpu_moe:
        lines.append(f"--n-cpu-moe {row.n_cpu_moe}")
    needs = [n.text() for n in row.needs]
    if needs:
        lines += ["", "Needs / usable here: " + "; ".join(needs)]
    if tv.resident is not None:
        lines.append(sentence(tv.resident.text()))
    if tv.why_not:
        lines += ["", f"Why not: {tv.why_not}"]
    return "\n".join(lines)


def speed_cell(row: TierRow) -> Cell:
    if row.speed is None:
        return Cell("—", "Does not run here: no speed to predict.")
    return Cell(row.speed.text(), row.speed.details())


def tier_fact_cells(tier: Tier) -> tuple[Cell, ...]:
    """Size, quality, vision and engines: the tier's own facts (columns 3-6)."""
    quality, qtip = quality_text(tier)
    return (
        Cell(fmt_bytes(tier.size_bytes), f"{tier.shard_count} shards; card: {tier.size_text}"),
        Cell(quality, qtip),
        Cell(vision_text(tier), tier.vision_note),
        Cell(", ".join(tier.engines), ""),
    )


def _name(tier: Tier, star: bool) -> str:
    return f"{'★ ' if star else ''}{tier.name}  ·  {tier.publisher}"


def _annotated(tier: Tier, cells: tuple[Cell, ...]) -> tuple[Cell, ...]:
    """A reference tier says so in its name; guessed files say so on the name's tooltip
    and in the size column."""
    out = list(cells)
    guessed = files_note(tier)
    name, size = out[0], out[3]
    text = name.text + ("  (reference)" if tier.reference else "")
    out[0] = Cell(text, f"{name.tooltip}\n{guessed}" if guessed else name.tip, name.tone)
    if guessed:
        out[3] = Cell(f"{size.text} · guessed", f"{size.tooltip}\n{guessed}", size.tone)
    return tuple(out)


def judged_row_cells(row: TierRow) -> tuple[Cell, ...]:
    """The row of a tier judged for one machine (:data:`COLUMNS`)."""
    tier = row.tier
    basis = row.basis_text and f"\nRank #{row.verdict.rank} rests on: {row.basis_text}"
    tone: Tone = "ok" if row.fits else "warn" if row.kind == "stream" else "danger"
    # a star only beside a tier that runs; when none does, the closest gets a hollow one
    mark = pick_mark(row.recommended, row.fits)
    pick = f"{PICK_TIPS[mark]}\n" if mark else ""
    return _annotated(
        tier,
        (
            Cell(
                f"{mark}{tier.name}  ·  {tier.publisher}",
                f"{pick}{tier.repo}\n{row.verdict.reason}{basis}",
            ),
            Cell(row.label, verdict_tip(row), tone),
            speed_cell(row),
            *tier_fact_cells(tier),
        ),
    )


def cluster_row_cells(row: ClusterTierRow, star: bool) -> tuple[Cell, ...]:
    """The row of a tier judged for a cluster (no speed: the engines report it)."""
    t = row.tier
    plan = row.assessment.plan
    tone: Tone | None = (
        "danger"
        if not row.runs
        else "ok"
        if plan is not None and plan.verdict == "fits"
        else "warn"
        if plan is not None and plan.verdict == "tight"
        else None
    )
    return _annotated(
        t,
        (
            Cell(_name(t, star), t.repo),
            Cell(row.label, row.detail(), tone),
            Cell("—", NO_CLUSTER_SPEED),
            *tier_fact_cells(t),
        ),
    )
