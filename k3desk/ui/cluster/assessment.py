"""The core's answer for one cluster, engine and tier, laid out: the verdict line, the
per-node memory plan, the refusals and warnings (verbatim) and the plan's notes.

Shown on the Cluster page and on the wizard's engine step, so both say the same thing.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.clusters import Assessment
from k3desk.core.app.values import fmt_bytes
from k3desk.ui import theme
from k3desk.ui.widgets import label, muted

PLAN_COLUMNS = ("Node", "Role", "Needs", "Usable", "Memory", "Disk")
VERDICT_TEXT = {
    "fits": "fits",
    "tight": "fits",
    "no-fit": "does not fit",
    "unknown": "unknown",
}


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


def verdict_line(a: Assessment) -> tuple[str, str]:
    """(the one-line verdict, its colour): "SparkInfer TP3: fits — …", "…: refused"."""
    c = theme.current()
    plan = a.plan
    if not a.ok:
        return f"{a.title}: refused", c.danger
    if plan is not None:
        word = VERDICT_TEXT.get(plan.verdict, plan.verdict)
        reason = plan.reason
        head = f"{a.title}: " + (reason if reason.startswith(word) else f"{word} — {reason}")
        color = {"fits": c.ok, "tight": c.warn, "no-fit": c.danger}.get(plan.verdict, c.text)
        return head, color
    return f"{a.title}: can start (probe for the memory plan)", c.text


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
        head, color = verdict_line(a)
        self.verdict.setText(head)
        self.verdict.setStyleSheet(f"color: {color};")
        plan = a.plan
        rows = plan.nodes if plan is not None else ()
        self.plan.setVisible(bool(rows))
        self.plan.setRowCount(len(rows))
        for i, b in enumerate(rows):
            cap = fmt_bytes(b.capacity) if b.capacity is not None else "unknown"
            cells = (b.node, b.role, fmt_bytes(b.need), cap, b.memory_kind, b.disk)
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip("\n".join([text, *b.notes]))
                if (j == 2 and b.fits is False) or (j == 5 and b.disk_ok is False):
                    item.setForeground(QColor(c.danger))
                self.plan.setItem(i, j, item)
        if rows:
            fit_height(self.plan)
        self.refusals.setText("\n".join(f"✗ {r}" for r in a.refusals))
        self.refusals.setVisible(bool(a.refusals))
        self.warnings.setText("\n".join(f"! {w}" for w in a.warnings))
        self.warnings.setVisible(bool(a.warnings))
        notes = plan.notes if plan is not None else ()
        self.notes.setText("\n".join(notes))
        self.notes.setVisible(bool(notes))
