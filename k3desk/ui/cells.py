"""A presenter's cell as a table item: its text, its tooltip, its tone in the theme's colour."""

from __future__ import annotations

from PySide6.QtGui import QColor
from PySide6.QtWidgets import QTableWidgetItem

from k3desk.core.app.presenters import Cell
from k3desk.ui import theme


def cell_item(cell: Cell, default_color: str | None = None) -> QTableWidgetItem:
    """The item for ``cell``; ``default_color``: the colour of a cell without a tone (None:
    the table's own)."""
    item = QTableWidgetItem(cell.text)
    item.setToolTip(cell.tooltip)
    color = theme.current().tone(cell.tone) if cell.tone is not None else default_color
    if color:
        item.setForeground(QColor(color))
    return item
