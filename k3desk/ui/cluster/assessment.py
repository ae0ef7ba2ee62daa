"""The core's answer for one cluster, engine and tier, laid out: the verdict line, the
per-node memory plan, the refusals and warnings (verbatim) and the plan's notes.

Shown on the Cluster page and on the wizard's engine step, so both say the same thing.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QTableWidget,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.clusters import Assessment
from k3desk.core.app.presenters.cluster_engine import PLAN_COLUMNS, plan_cells, verdict_line
from k3desk.ui import theme
from k3desk.ui.cells import cell_item
from k3desk.ui.widgets import label, muted


def fit_height(table: QTableWidget) -> None:
    """Size ``table`` to its rows (it lives in a scrolling page: no inner scroll bar)."""
    rows = sum(table.rowHeight(r) for r in range(table.rowCount()))
    table.setFixedHeight(table.horizontalHeader().height() + rows + 6)


def fixed_table(columns: tuple[str, ...], name: str, stretch: int) -> QTableWidget:
    """A read-only table sized to its contents, with column ``stretch`` taking the rest."""
    table = QTableWidget(0, len(columns))
    table.setObjectName(name)
    table.setHorizontalHeaderLabels(columns)
    table.verticalHeader().setVisible(False)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
    table.setWordWrap(False)
    table.setTextElideMode(Qt.TextElideMode.ElideRight)
    table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    hh = table.horizontalHeader()
    for col in range(len(columns)):
        hh.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
    hh.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    return table


class AssessmentView(QWidget):
    """Verdict, plan table, refusals, warnings and notes of one :class:`Assessment`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.verdict = label("", "sectionTitle", selectable=True)  # the name styles it
        lay.addWidget(self.verdict)
        self.plan = fixed_table(PLAN_COLUMNS, "planTable", stretch=5)
        lay.addWidget(self.plan)
        self.refusals = label("", "errorText", selectable=True)
        self.refusals.setTextFormat(Qt.TextFormat.PlainText)
        lay.addWidget(self.refusals)
        self.warnings = label("", "warnText", selectable=True)
        self.warnings.setTextFormat(Qt.TextFormat.PlainText)
        lay.addWidget(self.warnings)
        self.notes = muted("")
        self.notes.setTextFormat(Qt.TextFormat.PlainText)
        lay.addWidget(self.notes)
        self.assessment: Assessment | None = None

    def show_error(self, text: str) -> None:
        """No assessment: say why (e.g. the cluster file could not be read)."""
        self.assessment = None
        self.verdict.setText(text)
        self.verdict.setStyleSheet(f"color: {theme.current().danger};")
        for w in (self.plan, self.refusals, self.warnings, self.notes):
            w.hide()

    def show_assessment(self, a: Assessment) -> None:
        self.assessment = a
        c = theme.current()
        head, tone = verdict_line(a)
        self.verdict.setText(head)
        self.verdict.setStyleSheet(f"color: {c.tone(tone) if tone else c.text};")
        plan = a.plan
        rows = plan.nodes if plan is not None else ()
        self.plan.setVisible(bool(rows))
        self.plan.setRowCount(len(rows))
        for i, b in enumerate(rows):
            for j, cell in enumerate(plan_cells(b)):
                self.plan.setItem(i, j, cell_item(cell))
        if rows:
            fit_height(self.plan)
        self.refusals.setText("\n".join(f"✗ {r}" for r in a.refusals))
        self.refusals.setVisible(bool(a.refusals))
        self.warnings.setText("\n".join(f"! {w}" for w in a.warnings))
        self.warnings.setVisible(bool(a.warnings))
        notes = plan.notes if plan is not None else ()
        self.notes.setText("\n".join(notes))
        self.notes.setVisible(bool(notes))
