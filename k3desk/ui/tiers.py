"""The tier table: every catalog tier with its verdict for the machine (or for a cluster),
speed, size, quality, vision and engines; the recommended one is preselected and starred.

It renders a :class:`~k3desk.core.app.tiers.TierJudgement` (or the rows of a cluster) and
computes nothing: the verdict, the shortfall, the speed and the needs are the core's.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFont, QResizeEvent, QShowEvent
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem

from k3desk.core.app.cells import PICK_TIPS, pick_mark
from k3desk.core.app.cluster_tiers import ClusterTierRow
from k3desk.core.app.tiers import TierJudgement, TierRow, files_note
from k3desk.core.catalog.model import Tier
from k3desk.core.units import fmt_bytes
from k3desk.ui import theme

COLUMNS = ("Tier", "Verdict", "Speed", "Size", "Quality", "Vision", "Engines")
QUALITY_COLUMN = 4
# how narrow each column may get when space is short (its text then elided); the speed
# column never shrinks
FLOORS = {0: 150, 1: 150, 3: 90, QUALITY_COLUMN: 80, 5: 70, 6: 70}
SHRINK_FIRST = (QUALITY_COLUMN, 6, 0)  # quality, engines, tier: when space is short
VERDICT_COLUMN = 1
SPEED_COLUMN = 2

AnyRow = TierRow | ClusterTierRow


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
    if tv.why_not:
        lines += ["", f"Why not: {tv.why_not}"]
    return "\n".join(lines)


def speed_cells(row: TierRow) -> tuple[str, str]:
    if row.speed is None:
        return "—", "Does not run here: no speed to predict."
    return row.speed.text(), row.speed.details()


class TierTable(QTableWidget):
    """Signals:
    tier_selected(object): the TierRow (or ClusterTierRow) of the selected row.
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
        # widths set by _fit_columns: every column on screen, the long texts elided
        h.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        h.setStretchLastSection(False)
        self.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.rows: list[AnyRow] = []
        self.recommended: AnyRow | None = None
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
            if col == VERDICT_COLUMN:
                item.setForeground(QColor(color))
            if star:
                f = QFont(item.font())
                f.setBold(True)
                item.setFont(f)
            if tier.reference and col == 0:
                text += "  (reference)"
            guessed = files_note(tier)
            if guessed and col in (0, 3):  # the name's tooltip, and the size column
                if col == 3:
                    text += " · guessed"
                tip = f"{tip}\n{guessed}"
            item.setText(text)
            item.setToolTip(tip)
            self.setItem(r, col, item)

    def set_cluster(
        self, rows: Sequence[ClusterTierRow], recommended: ClusterTierRow | None
    ) -> None:
        """Every tier judged for a cluster (no speed prediction: the engines report it)."""
        self.rows = list(rows)
        self.recommended = recommended
        c = theme.current()
        self.blockSignals(True)
        self.clearSelection()
        self.setRowCount(len(rows))
        for r, row in enumerate(rows):
            t = row.tier
            star = row is recommended
            plan = row.assessment.plan
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
                (row.label, row.detail()),
                ("—", "No speed prediction for a cluster: the engine reports it per answer."),
                *self._tier_cells(t),
            )
            self._fill_row(r, t, cells, color, star)
        self.blockSignals(False)
        self._fit_columns()
        if recommended is not None:
            self.select_tier(recommended.tier.id)

    def set_judgement(self, judged: TierJudgement) -> None:
        """Every tier judged for one machine; the pick preselected and starred."""
        self.rows = list(judged.rows)
        self.recommended = judged.chosen
        c = theme.current()
        self.blockSignals(True)
        self.clearSelection()
        self.setRowCount(len(judged.rows))
        for r, row in enumerate(judged.rows):
            tier = row.tier
            star = row.recommended
            mark = pick_mark(star, row.fits)
            name = f"{mark}{tier.name}  ·  {tier.publisher}"
            basis = row.basis_text and f"\nRank #{row.verdict.rank} rests on: {row.basis_text}"
            pick = f"{PICK_TIPS[mark]}\n" if mark else ""
            cells = (
                (name, f"{pick}{tier.repo}\n{row.verdict.reason}{basis}"),
                (row.label, verdict_tip(row)),
                speed_cells(row),
                *self._tier_cells(tier),
            )
            color = c.ok if row.fits else c.warn if row.kind == "stream" else c.danger
            self._fill_row(r, tier, cells, color, star)
        self.blockSignals(False)
        self._fit_columns()
        if self.recommended is not None:
            self.select_tier(self.recommended.tier.id)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_columns()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        # filled before it had a size, the preselected row may sit below the fold
        self._show_current()

    def _show_current(self) -> None:
        rows = sorted({i.row() for i in self.selectedIndexes()})
        item = self.item(rows[0], 0) if rows else None
        if item is not None:
            self.scrollToItem(item, QAbstractItemView.ScrollHint.PositionAtCenter)

    def _fit_columns(self) -> None:
        """Every column visible at the table's width (1024 px windows included): columns
        take their contents' width; when that is too wide, each gives up the same share of
        what it can spare above its floor (:data:`FLOORS`), and its text is elided (the
        full text is in the tooltip and the detail below the table)."""
        avail = self.viewport().width()
        if avail <= 0 or self.columnCount() == 0:
            return
        h = self.horizontalHeader()
        want = [
            max(self.sizeHintForColumn(i), h.sectionSizeHint(i))
            for i in range(self.columnCount())
        ]
        widths = list(want)
        flexible = [i for i in FLOORS if i < len(widths)]
        over = sum(widths) - avail
        # the columns whose full text is a tooltip away give way first (quality, engines,
        # the name); the verdict, size and vision are read at a glance, whole
        for i in SHRINK_FIRST:
            if over <= 0 or i >= len(widths):
                break
            take = min(over, max(0, widths[i] - FLOORS[i]))
            widths[i] -= take
            over -= take
        if over > 0:
            room = {i: max(0, widths[i] - FLOORS[i]) for i in flexible}
            total = sum(room.values())
            if total > 0:  # each gives up the same share of what it can spare
                for i in flexible:
                    widths[i] -= min(room[i], -(-over * room[i] // total))
        elif len(widths) > QUALITY_COLUMN:
            widths[QUALITY_COLUMN] += -over  # spare width goes to the quality column
        for i, w in enumerate(widths):
            h.resizeSection(i, w)

    def select_tier(self, tier_id: str) -> None:
        for r, row in enumerate(self.rows):
            if row.tier.id == tier_id:
                self.selectRow(r)
                self._show_current()
                return

    def current(self) -> AnyRow | None:
        rows = {i.row() for i in self.selectedIndexes()}
        return self.rows[min(rows)] if rows else None

    def _selected(self) -> None:
        row = self.current()
        if row is not None:
            self.tier_selected.emit(row)
