"""The tier table: every catalog tier with its verdict for the machine (or for a cluster),
speed, size, quality, vision and engines; the recommended one is preselected and starred."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem

from k3desk.core.catalog.model import Tier
from k3desk.core.planning.recommend import Recommendation, TierVerdict
from k3desk.core.units import fmt_bytes
from k3desk.ui import theme

if TYPE_CHECKING:
    from k3desk.ui.cluster.controller import TierOnCluster

COLUMNS = ("Tier", "Verdict", "Speed", "Size", "Quality", "Vision", "Engines")
SPARKINFER_ONLY = "SparkInfer loads only vcruz305's UD-IQ1_S"


def cluster_verdict_text(row: TierOnCluster) -> str:
    """The verdict cell for a tier on a cluster: the engine's refusal or the memory plan."""
    from k3desk.core.cluster.sparkinfer import GEOMETRY_ERROR

    a = row.assessment
    if not a.ok:
        if any(GEOMETRY_ERROR in r for r in a.refusals):
            return "refused: SparkInfer cannot load it"
        first = a.refusals[0]
        return "refused: " + (first if len(first) <= 70 else first[:69].rstrip() + "…")
    plan = a.plan
    if plan is None:
        return "can start (probe for the memory plan)"
    if plan.verdict == "fits":
        return "fits on the cluster"
    if plan.verdict == "tight":
        return "fits, with little room"
    if plan.verdict == "no-fit":
        return f"won't fit: {plan.reason}"
    return f"unknown: {plan.reason}"


def cluster_verdict_tip(row: TierOnCluster) -> str:
    a = row.assessment
    lines = [f"{a.title}"]
    if a.plan is not None:
        lines.append(f"{a.plan.verdict}: {a.plan.reason}")
    lines += [f"✗ {r}" for r in a.refusals]
    lines += [f"! {w}" for w in a.warnings]
    return "\n".join(lines)


def verdict_text(tv: TierVerdict) -> str:
    plan = tv.plan
    if tv.verdict == "gpu":
        return "GPU: everything on the GPUs"
    if tv.verdict == "hybrid" and plan is not None:
        return f"hybrid: {plan.n_cpu_moe} expert layers on CPU"
    if tv.verdict == "cpu":
        return "CPU only"
    if tv.verdict == "stream":
        return f"won't fit: streams {fmt_bytes(tv.shortfall)} from disk"
    if tv.verdict == "no-fit":
        return "won't fit"
    return "no plan"


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


class TierTable(QTableWidget):
    """Signals:
    tier_selected(object): the TierVerdict of the selected row.
    """

    tier_selected = Signal(object)

    def __init__(self) -> None:
        super().__init__(0, len(COLUMNS))
        self.setObjectName("tierTable")
        self.setHorizontalHeaderLabels(list(COLUMNS))
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setAlternatingRowColors(True)
        self.verticalHeader().setVisible(False)
        self.setWordWrap(False)
        h = self.horizontalHeader()
        h.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        self.verdicts: list[TierVerdict | TierOnCluster] = []
        self.recommended: TierVerdict | TierOnCluster | None = None
        self.itemSelectionChanged.connect(self._selected)

    def _tier_cells(self, tier: Tier) -> tuple[tuple[str, str], ...]:
        """Size, quality, vision and engines: the tier's own facts (columns 3-6)."""
        quality, qtip = quality_text(tier)
        return (
            (fmt_bytes(tier.size_bytes), f"{tier.shard_count} shards; card: {tier.size_text}"),
            (quality, qtip),
            (vision_text(tier), tier.vision_note),
            (", ".join(tier.engines), ""),
        )

    def _fill_row(
        self, r: int, tier: Tier, cells: Sequence[tuple[str, str]], color: str, star: bool
    ) -> None:
        for col, (text, tip) in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(tip)
            if col == 1:
                item.setForeground(QColor(color))
            if star:
                f = QFont(item.font())
                f.setBold(True)
                item.setFont(f)
            if tier.reference and col == 0:
                text += "  (reference)"
            if not tier.known and col in (0, 3):  # the name's tooltip, and the size column
                if col == 3:
                    text += " · guessed"
                tip = f"{tip}\n{tier.files_guessed[:1].upper()}{tier.files_guessed[1:]}."
            item.setText(text)
            item.setToolTip(tip)
            self.setItem(r, col, item)

    def set_cluster(self, rows: Sequence[TierOnCluster], recommended: TierOnCluster | None) -> None:
        """Every tier judged for a cluster (no speed prediction: the engines report it)."""
        self.verdicts = list(rows)
        self.recommended = recommended
        c = theme.current()
        self.blockSignals(True)
        self.clearSelection()
        self.setRowCount(len(rows))
        for r, row in enumerate(rows):
            t = row.tier
            star = row is recommended
            a = row.assessment
            plan = a.plan
            color = (
                c.danger
                if not row.runs
                else c.ok
                if plan is not None and plan.verdict == "fits"
                else c.warn
                if plan is not None and plan.verdict == "tight"
                else c.text
            )
            cells = (
                (f"{'★ ' if star else ''}{t.name}  ·  {t.publisher}", t.repo),
                (cluster_verdict_text(row), cluster_verdict_tip(row)),
                ("—", "No speed prediction for a cluster: the engine reports it per answer."),
                *self._tier_cells(t),
            )
            self._fill_row(r, t, cells, color, star)
        self.blockSignals(False)
        if recommended is not None:
            self.select_tier(recommended.tier.id)

    def set_recommendation(self, rec: Recommendation) -> None:
        self.verdicts = list(rec.verdicts)
        self.recommended = rec.best or rec.closest
        c = theme.current()
        self.blockSignals(True)
        self.clearSelection()
        self.setRowCount(len(rec.verdicts))
        for r, tv in enumerate(rec.verdicts):
            plan = tv.plan
            star = tv is self.recommended
            name = f"{'★ ' if star else ''}{tv.tier.name}  ·  {tv.tier.publisher}"
            speed = f"{plan.speed.expected_tps:.2g} tok/s" if plan is not None else "—"
            basis = f"\nRank #{tv.rank} rests on: {tv.basis.text()}" if tv.basis else ""
            cells = (
                (name, f"{tv.tier.repo}\n{tv.reason}{basis}"),
                (
                    verdict_text(tv),
                    tv.reason + (f"\n\nWhy not: {tv.why_not}" if tv.why_not else ""),
                ),
                (
                    speed,
                    (
                        f"{plan.speed.low_tps:.2g}-{plan.speed.high_tps:.2g} tok/s; "
                        f"bottleneck: {plan.speed.bottleneck}"
                    )
                    if plan is not None
                    else "",
                ),
                *self._tier_cells(tv.tier),
            )
            color = (
                c.ok
                if tv.verdict in ("gpu", "hybrid", "cpu")
                else c.warn
                if tv.verdict == "stream"
                else c.danger
            )
            self._fill_row(r, tv.tier, cells, color, star)
        self.blockSignals(False)
        if self.recommended is not None:
            self.select_tier(self.recommended.tier.id)

    def select_tier(self, tier_id: str) -> None:
        for r, tv in enumerate(self.verdicts):
            if tv.tier.id == tier_id:
                self.selectRow(r)
                item = self.item(r, 0)
                if item is not None:
                    self.scrollToItem(item, QAbstractItemView.ScrollHint.EnsureVisible)
                return

    def current(self) -> TierVerdict | TierOnCluster | None:
        rows = {i.row() for i in self.selectedIndexes()}
        return self.verdicts[min(rows)] if rows else None

    def _selected(self) -> None:
        tv = self.current()
        if tv is not None:
            self.tier_selected.emit(tv)


def align_center(item: QTableWidgetItem) -> None:
    item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
