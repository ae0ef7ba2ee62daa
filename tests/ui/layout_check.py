"""What a person would call "cut off" in a window, found by walking its widgets.

``problems(top)`` lists, for every visible widget under ``top``:

* a button or a one-line label narrower than its text (Qt clips it mid-word: "elaunch ...");
* a widget that reaches past the edge of the window, or of the scroll area or splitter it
  lives in (the part outside is never shown and cannot be scrolled to);
* a table or list with rows whose viewport cannot show three of them (or all it has);
* two visible widgets of one layout drawn over each other (a caption over its table);
* a widget in a table's cell (a row's Download button) taller than its row.

Widgets inside a scroll area are judged against the area's whole content, which a person
can scroll to; an elided label (it shortens its text on purpose, with a tooltip) is not cut.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractScrollArea,
    QLabel,
    QLayout,
    QTableView,
    QWidget,
)

SLACK = 2  # pixels a style may lend a frame


def problems(top: QWidget) -> list[str]:
    """Every cut, overflow, unreachable table and overlap under ``top`` (visible widgets)."""
    found: list[str] = []
    for w in top.findChildren(QWidget):
        if not w.isVisibleTo(top) or w.width() <= 0 or _in_hidden_scroll_chrome(w):
            continue
        found += _text_cut(w) + _outside(w, top) + _table_unreachable(w) + _cell_cut(w)
    for lay in top.findChildren(QLayout):
        found += _overlaps(lay, top)
    return found


def _name(w: QWidget) -> str:
    text = ""
    if isinstance(w, QAbstractButton | QLabel):
        text = " " + repr(w.text()[:40])
    return f"{type(w).__name__}({w.objectName() or '-'}){text}"


def _in_hidden_scroll_chrome(w: QWidget) -> bool:
    """Scroll bars' inner widgets and such: not content a person reads."""
    parent = w.parentWidget()
    return parent is not None and type(parent).__name__ in {"QScrollBar", "QHeaderView"}


def _text_cut(w: QWidget) -> list[str]:
    if isinstance(w, QAbstractButton) and w.text():
        need = w.minimumSizeHint().width()
        if w.width() + SLACK < need:
            return [f"cut: {_name(w)} is {w.width()} px wide, its text needs {need}"]
    if (
        isinstance(w, QLabel)
        and w.text()
        and not w.wordWrap()
        and type(w).__name__ != "ElidedLabel"
        and w.pixmap().isNull()
    ):
        need = w.sizeHint().width()
        if w.width() + SLACK < need:
            return [f"cut: {_name(w)} is {w.width()} px wide, its text needs {need}"]
    if isinstance(w, QLabel) and w.text() and w.wordWrap() and w.hasHeightForWidth():
        need = w.heightForWidth(w.width())
        if w.height() + SLACK < need:
            return [f"cut: {_name(w)} is {w.height()} px high, its lines need {need}"]
    return []


def _scrolled(w: QWidget) -> bool:
    """``w`` is what a scroll area scrolls (its viewport's child), or its viewport."""
    p = w.parentWidget()
    if isinstance(p, QAbstractScrollArea):
        return True
    area = p.parentWidget() if p is not None else None
    return isinstance(area, QAbstractScrollArea) and area.viewport() is p


def _frame(w: QWidget, top: QWidget) -> tuple[QWidget, QRect]:
    """The nearest ancestor that clips ``w`` for good (the window, or a scroll area's
    content, which scrolling reveals), and its rectangle in that ancestor's coordinates."""
    p = w.parentWidget()
    while p is not None and p is not top:
        if _scrolled(p):
            return p, p.rect()  # a scroll area's content: every part of it is reachable
        p = p.parentWidget()
    return top, top.rect()


def _outside(w: QWidget, top: QWidget) -> list[str]:
    if _scrolled(w):
        return []
    frame, rect = _frame(w, top)
    tl = w.mapTo(frame, QPoint(0, 0))
    mine = QRect(tl, w.size())
    grown = rect.adjusted(-SLACK, -SLACK, SLACK, SLACK)
    if grown.contains(mine):
        return []
    return [
        f"outside: {_name(w)} at {mine.x()},{mine.y()} {mine.width()}x{mine.height()} "
        f"beyond {type(frame).__name__} {rect.width()}x{rect.height()}"
    ]


def _table_unreachable(w: QWidget) -> list[str]:
    if not isinstance(w, QAbstractItemView) or w.model() is None:
        return []
    if w.model().rowCount() == 0:
        return []
    rows = min(3, w.model().rowCount())
    row = w.sizeHintForRow(0)
    if isinstance(w, QTableView) and row <= 0:
        row = w.verticalHeader().defaultSectionSize()
    need = rows * row
    if row > 0 and w.viewport().height() + SLACK < need:
        shows = w.viewport().height()
        return [f"unreachable: {_name(w)} shows {shows} px, {rows} rows need {need}"]
    return []


def _cell_cut(w: QWidget) -> list[str]:
    viewport = w.parentWidget()
    table = viewport.parentWidget() if viewport is not None else None
    if not isinstance(table, QTableView) or table.viewport() is not viewport:
        return []
    row = table.rowAt(w.geometry().center().y())
    if row < 0:
        return []
    need = w.sizeHint().height()
    if table.rowHeight(row) + SLACK < need:
        return [f"cut: {_name(w)} in a row {table.rowHeight(row)} px high needs {need}"]
    return []


def _overlaps(lay: QLayout, top: QWidget) -> list[str]:
    items = []
    for i in range(lay.count()):
        item = lay.itemAt(i)
        w = item.widget() if item is not None else None
        if w is not None and w.isVisibleTo(top) and w.width() > 0 and w.height() > 0:
            items.append(w)
    found = []
    for i, a in enumerate(items):
        for b in items[i + 1 :]:
            if a.parentWidget() is not b.parentWidget():
                continue
            inter = a.geometry().intersected(b.geometry())
            if inter.width() > SLACK and inter.height() > SLACK:
                area = f"{inter.width()}x{inter.height()}"
                found.append(f"overlap: {_name(a)} and {_name(b)} share {area}")
    return found
