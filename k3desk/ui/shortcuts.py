"""The keyboard shortcuts, listed (F1 or Ctrl+/ on the main window)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from k3desk.ui.widgets import muted

# (keys, what they do, where): every QShortcut and key handler of the app
SHORTCUTS: tuple[tuple[str, str, str], ...] = (
    ("Ctrl+1 … Ctrl+6", "Chat, Models, Downloads, Engine, Settings, Cluster", "anywhere"),
    ("F1, Ctrl+/", "This list", "anywhere"),
    ("Ctrl+N", "A new chat", "Chat"),
    ("Ctrl+F", "Search the conversations", "Chat"),
    ("Ctrl+E", "Export the conversation as Markdown", "Chat"),
    ("Delete", "Delete the selected conversation (asked first)", "Chat, its list"),
    ("Enter", "Send the message", "Chat, the message box"),
    ("Shift+Enter", "A new line in the message", "Chat, the message box"),
    ("Esc", "Stop the answer, or cancel an edit", "Chat, the message box"),
    ("Ctrl+V", "Paste an image (or text) into the message", "Chat, the message box"),
)
HELP_KEYS = ("F1", "Ctrl+/")


class ShortcutList(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("shortcutList")
        self.setWindowTitle("Keyboard shortcuts")
        lay = QVBoxLayout(self)
        self.table = QTableWidget(len(SHORTCUTS), 3)
        self.table.setHorizontalHeaderLabels(["Keys", "What it does", "Where"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
        self.table.setWordWrap(False)
        for r, row in enumerate(SHORTCUTS):
            for c, text in enumerate(row):
                self.table.setItem(r, c, QTableWidgetItem(text))
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        h.setStretchLastSection(True)
        lay.addWidget(self.table)
        lay.addWidget(muted("Drop a .gguf file or a folder anywhere on the window: My models."))
        box = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        box.rejected.connect(self.reject)
        lay.addWidget(box)
        self.table.resizeColumnsToContents()
        width = sum(self.table.columnWidth(c) for c in range(3)) + 60
        self.resize(max(560, width), 80 + self.table.verticalHeader().length() + 120)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)

    def rows(self) -> list[list[str]]:
        """The rows as shown."""
        return [
            [(self.table.item(r, c) or QTableWidgetItem()).text() for c in range(3)]
            for r in range(self.table.rowCount())
        ]
