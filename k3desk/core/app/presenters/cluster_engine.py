"""A cluster engine: the core's verdict in one line, the per-node memory plan, and the
processes of a running engine (shown on the Cluster page and the wizard's engine step)."""

from __future__ import annotations

from k3desk.core.app.presenters import Cell, Tone
from k3desk.core.cluster.assess import Assessment
from k3desk.core.cluster.members import Member
from k3desk.core.cluster.plan import NodeBudget
from k3desk.core.units import fmt_bytes

PLAN_COLUMNS = ("Node", "Role", "Needs", "Usable", "Memory", "Disk")
MEMBER_COLUMNS = ("Process", "Node", "Host", "Role", "State", "PID")
VERDICT_TEXT = {
    "fits": "fits",
    "tight": "fits",
    "no-fit": "does not fit",
    "unknown": "unknown",
}


def verdict_line(a: Assessment) -> tuple[str, Tone | None]:
    """(the one-line verdict, its tone): "SparkInfer TP3: fits — …", "…: refused"."""
    plan = a.plan
    if not a.ok:
        return f"{a.title}: refused", "danger"
    if plan is not None:
        word = VERDICT_TEXT.get(plan.verdict, plan.verdict)
        reason = plan.reason
        head = f"{a.title}: " + (reason if reason.startswith(word) else f"{word} — {reason}")
        tones: dict[str, Tone] = {"fits": "ok", "tight": "warn", "no-fit": "danger"}
        return head, tones.get(plan.verdict)
    return f"{a.title}: can start (probe for the memory plan)", None


def plan_cells(b: NodeBudget) -> tuple[Cell, ...]:
    """A node's share of the plan (:data:`PLAN_COLUMNS`): what it needs against what it
    has, in red where it does not fit or its disk falls short; its notes in every tooltip."""
    cap = fmt_bytes(b.capacity) if b.capacity is not None else "unknown"
    texts = (b.node, b.role, fmt_bytes(b.need), cap, b.memory_kind, b.disk)
    short = {2: b.fits is False, 5: b.disk_ok is False}
    return tuple(
        Cell(t, "\n".join([t, *b.notes]), "danger" if short.get(j) else None)
        for j, t in enumerate(texts)
    )


def member_cells(m: Member) -> tuple[Cell, ...]:
    """One process of a running engine: its state red once it ended, green while it runs."""
    texts = (m.name, m.node, m.host, m.role, m.state, str(m.pid or ""))
    state: Tone | None = (
        "danger"
        if m.state.startswith("ended")
        else "ok"
        if m.state in ("running", "ready")
        else None
    )
    return tuple(
        Cell(t, f"{t}\nlog: {m.log}" if m.log else t, state if j == 4 else None)
        for j, t in enumerate(texts)
    )
