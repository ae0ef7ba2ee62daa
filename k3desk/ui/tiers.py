"""The tier table: every catalog tier with its verdict for the machine (or for a cluster),
speed, size, quality, vision and engines; the recommended one is preselected and starred.

It renders a :class:`~k3desk.core.app.tiers.TierJudgement` (or the rows of a cluster) and
computes nothing: the verdict, the shortfall, the speed and the needs are the core's, and
each cell's text, tooltip and tone come from :mod:`k3desk.core.app.presenters.tiers`.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QResizeEvent, QShowEvent
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget

from k3desk.core.app.cluster_tiers import ClusterTierRow
from k3desk.core.app.presenters import Cell
from k3desk.core.app.presenters.tiers import (
    COLUMNS,
    QUALITY_COLUMN,
    SPEED_COLUMN,
    VERDICT_COLUMN,
    cluster_row_cells,
    judged_row_cells,
)
from k3desk.core.app.tiers import TierJudgement, TierRow
from k3desk.ui import theme
from k3desk.ui.cells import cell_item

# how narrow each column may get when space is short (its text then elided); the speed
# column never shrinks
FLOORS = {0: 150, 1: 150, 3: 90, QUALITY_COLUMN: 80, 5: 70, 6: 70}
SHRINK_FIRST = (QUALITY_COLUMN, 6, 0)  # quality, engines, tier: when space is short

AnyRow = TierRow | ClusterTierRow
__all__ = ["COLUMNS", "SPEED_COLUMN", "VERDICT_COLUMN", "AnyRow", "TierTable"]


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

    def _fill_row(self, r: int, cells: Sequence[Cell], star: bool) -> None:
        text = theme.current().text  # a verdict without a tone: the text's own colour
        for col, cell in enumerate(cells):
            item = cell_item(cell, text if col == VERDICT_COLUMN else None)
            if star:
                f = QFont(item.font())
                f.setBold(True)
                item.setFont(f)
            self.setItem(r, col, item)

    def set_cluster(
        self, rows: Sequence[ClusterTierRow], recommended: ClusterTierRow | None
    ) -> None:
        """Every tier judged for a cluster (no speed prediction: the engines report it)."""
        self.rows = list(rows)
        self.recommended = recommended
        self.blockSignals(True)
        self.clearSelection()
        self.setRowCount(len(rows))
        for r, row in enumerate(rows):
            star = row is recommended
            self._fill_row(r, cluster_row_cells(row, star), star)
        self.blockSignals(False)
        self._fit_columns()
        if recommended is not None:
            self.select_tier(recommended.tier.id)

    def set_judgement(self, judged: TierJudgement) -> None:
        """Every tier judged for one machine; the pick preselected and starred."""
        self.rows = list(judged.rows)
        self.recommended = judged.chosen
        self.blockSignals(True)
        self.clearSelection()
        self.setRowCount(len(judged.rows))
        for r, row in enumerate(judged.rows):
            self._fill_row(r, judged_row_cells(row), row.recommended)
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
