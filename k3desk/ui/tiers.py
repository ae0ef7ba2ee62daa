"""The tier table: every catalog tier with its verdict for the machine, speed, size, quality,
vision and engines; the recommended one is preselected and starred."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem

from k3desk.core.planning.recommend import Recommendation, TierVerdict
from k3desk.core.units import fmt_bytes
from k3desk.ui import theme

COLUMNS = ("Tier", "Verdict", "Speed", "Size", "Quality", "Vision", "Engines")


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


def vision_text(tv: TierVerdict) -> str:
    t = tv.tier
    if not t.mmproj or t.vision == "none":
        return "no"
    return "yes" if t.vision == "upstream" else "yes (fork build)"


def quality_text(tv: TierVerdict) -> tuple[str, str]:
    t = tv.tier
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
        self.verdicts: list[TierVerdict] = []
        self.recommended: TierVerdict | None = None
        self.itemSelectionChanged.connect(self._selected)

    def set_recommendation(self, rec: Recommendation) -> None:
        self.verdicts = list(rec.verdicts)
        self.recommended = rec.best or rec.closest
        c = theme.current()
        self.blockSignals(True)
        self.setRowCount(len(self.verdicts))
        for r, tv in enumerate(self.verdicts):
            plan = tv.plan
            star = tv is self.recommended
            name = f"{'★ ' if star else ''}{tv.tier.name}  ·  {tv.tier.publisher}"
            quality, qtip = quality_text(tv)
            speed = f"{plan.speed.expected_tps:.2g} tok/s" if plan is not None else "—"
            cells = (
                (name, f"{tv.tier.repo}\n{tv.reason}"),
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
                (
                    fmt_bytes(tv.tier.size_bytes),
                    f"{tv.tier.shard_count} shards; card: {tv.tier.size_text}",
                ),
                (quality, qtip),
                (vision_text(tv), tv.tier.vision_note),
                (", ".join(tv.tier.engines), ""),
            )
            for col, (text, tip) in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(tip)
                if col == 1:
                    color = (
                        c.ok
                        if tv.verdict in ("gpu", "hybrid", "cpu")
                        else c.warn
                        if tv.verdict == "stream"
                        else c.danger
                    )
                    item.setForeground(QColor(color))
                if star:
                    f = QFont(item.font())
                    f.setBold(True)
                    item.setFont(f)
                if tv.tier.reference and col == 0:
                    item.setText(text + "  (reference)")
                self.setItem(r, col, item)
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

    def current(self) -> TierVerdict | None:
        rows = {i.row() for i in self.selectedIndexes()}
        return self.verdicts[min(rows)] if rows else None

    def _selected(self) -> None:
        tv = self.current()
        if tv is not None:
            self.tier_selected.emit(tv)


def align_center(item: QTableWidgetItem) -> None:
    item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
