"""The Hub's Kimi-K3 sets in the wizard's tiers step: one row per set, its verdict marked
with what it rests on (the set's real headers, read before any download, or the catalog),
the card's facts where the set is a catalog tier, and the line that says what was searched
(or that the catalog alone is shown, and why)."""

from __future__ import annotations

from k3desk.core.app.hub_choice import projector_note
from k3desk.core.app.presenters import Cell, Tone
from k3desk.core.app.search import SearchResult, SetRow, shown, size_text

COLUMNS = ("On the Hub", "Fit here", "Judged from", "Parts", "Size", "Catalog tier")

RUNS = ("gpu", "hybrid", "cpu")


def verdict_text(row: SetRow) -> str:
    """The verdict as the tiers table words it, with the offload count and speed."""
    text = row.verdict
    if row.kind == "hybrid" and row.n_cpu_moe:
        text += f" (--n-cpu-moe {row.n_cpu_moe})"
    if row.speed:
        text += f", ~{row.speed}"
    return text


def card_facts(row: SetRow) -> list[str]:
    """The catalog card's facts for a set that is a tier's files (quality, caveats, fork)."""
    t = row.tier
    if t is None:
        return []
    out = [f"Catalog tier: {t.publisher} {t.name} ({t.id})."]
    out += [f"{q.metric}: {q.value} ({q.conditions})" for q in t.quality[:3]]
    if t.quality_caveat:
        out.append(f"Quality figures (*): {t.quality_caveat}")
    out += list(t.caveats[:2])
    if t.vision_engine:
        out.append(f"Images need the {t.vision_engine} llama.cpp fork.")
    return out


def hub_set_cells(row: SetRow) -> tuple[Cell, ...]:
    """One set's row (:data:`COLUMNS`)."""
    tone: Tone | None = (
        "ok" if row.kind in RUNS else "warn" if row.kind == "stream" else
        "danger" if row.kind else None
    )  # fmt: skip
    where = f"{shown(row.repo)} at commit {shown(row.revision[:12])}"
    verdict_tip = "\n".join(
        [
            f"Judged from the {row.basis_text()}"
            + (" (read by ranges before any download)." if row.basis == "headers" else "."),
            *([shown(row.problem, 600)] if row.problem else []),
            *(shown(s, 300) for s in row.suspicious[:2]),
        ]
    )
    tier = row.tier
    return (
        Cell(f"{shown(row.repo)} · {shown(row.remote.name)}", where),
        Cell(verdict_text(row), verdict_tip, tone),
        Cell(row.basis_text(), verdict_tip),
        Cell(str(row.remote.count), shown(row.remote.include)),
        Cell(size_text(row.remote.total_bytes)),
        Cell(
            f"{tier.publisher} {tier.name}" if tier is not None else "—",
            "\n".join(card_facts(row)) or "Not in the catalog: no card facts.",
        ),
    )


def hub_set_details(row: SetRow) -> list[str]:
    """The chosen set in full (plain lines; the shell escapes them)."""
    lines = [
        f"{shown(row.repo)} · {shown(row.remote.name)}, at commit {shown(row.revision[:12])}: "
        f"{row.remote.count} parts, {size_text(row.remote.total_bytes)}.",
        f"{verdict_text(row)}. Judged from the {row.basis_text()}"
        + (", read before any download." if row.basis == "headers" else "."),
    ]
    if row.plan is not None:
        lines += list(row.plan.planned.plan.notes[:3])
    lines += [shown(row.problem, 600)] if row.problem else []
    lines += [shown(s, 300) for s in row.suspicious[:1]]
    lines += card_facts(row)
    if row.projectors:
        lines.append(
            "Projectors in the repository: " + ", ".join(shown(p, 120) for p in row.projectors[:8])
        )
    lines.append(
        f"Downloads exactly {shown(row.remote.include)} at that commit and the set's vision "
        "projector, each file checked against the Hub's hashes."
    )
    lines.append(projector_note(row.tier))
    return lines


def hub_status(result: SearchResult) -> str:
    """What the wizard says under the catalog: what the Hub has, or why it is not shown."""
    if result.offline:
        return (
            f"Catalog only: the Hub could not be searched ({shown(result.offline_reason, 600)}). "
            "The tiers above are the catalog's, judged from its figures."
        )
    if not result.rows:
        return f"No Kimi-K3 GGUF set found on {result.endpoint}; the catalog's tiers are above."
    read = sum(1 for r in result.rows if r.basis == "headers")
    text = f"On the Hub now: {result.status}; {read} judged from their real headers."
    if result.errors:
        text += f" Not listed: {'; '.join(shown(e, 300) for e in result.errors[:2])}."
    return text
