"""Small shared widgets and helpers: page headers, empty states, banners, copy fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QRect, QSize, Qt
from PySide6.QtGui import QGuiApplication, QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableView,
    QToolButton,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from k3desk.ui import theme

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext


def fit_screen(widget: QWidget, width: int, height: int, margin: int = 48) -> QSize:
    """``width`` x ``height``, made smaller where the screen (its free area) is: a window
    that opens larger than a 1024x700 screen hides its own buttons."""
    free = (widget.screen() or QGuiApplication.primaryScreen()).availableGeometry()
    return QSize(min(width, free.width() - margin), min(height, free.height() - margin))


def dialog_folder(ctx: AppContext, kind: str, current: str = "") -> str:
    """Where a file dialog opens (:func:`k3desk.core.app.folders.start_folder`): ``kind`` is
    "model", "image", "export" or "other"; ``current`` the path in the field it fills."""
    from k3desk.core.app.folders import Kind, start_folder

    return str(start_folder(Kind(kind), ctx.settings, ctx.services.paths, current=current))


def primary(button: QPushButton) -> QPushButton:
    """Mark ``button`` as the page's main action (accent colour)."""
    button.setProperty("primary", True)
    button.setDefault(False)
    button.setAutoDefault(False)
    return button


def set_enabled(widget: QWidget, enabled: bool, why_not: str = "", tip: str = "") -> None:
    """Enable ``widget``, or disable it with a tooltip that says why."""
    widget.setEnabled(enabled)
    widget.setToolTip(tip if enabled else why_not)


def label(text: str = "", name: str = "", wrap: bool = True, selectable: bool = False) -> QLabel:
    lab = QLabel(text)
    if name:
        lab.setObjectName(name)
    lab.setWordWrap(wrap)
    if selectable:
        lab.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return lab


def muted(text: str = "") -> QLabel:
    lab = label(text)
    lab.setProperty("muted", True)
    return lab


class PageHeader(QWidget):
    """A page title with a one-line explanation under it."""

    def __init__(self, title: str, subtitle: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 8)
        lay.setSpacing(2)
        self.title = label(title, "pageTitle", wrap=False)
        self.subtitle = label(subtitle, "pageSubtitle")
        lay.addWidget(self.title)
        lay.addWidget(self.subtitle)
        self.subtitle.setVisible(bool(subtitle))


class Banner(QFrame):
    """A coloured strip for warnings and notes; hidden when empty."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 6)
        self.text = label("")
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setOpenExternalLinks(False)
        lay.addWidget(self.text, 1)
        self.hide()

    def show_text(self, text: str) -> None:
        self.text.setText(text)
        self.setVisible(bool(text))


class Card(QFrame):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        self.body = QVBoxLayout(self)
        self.body.setContentsMargins(14, 12, 14, 12)
        self.body.setSpacing(6)


def say_copied(widget: QWidget, text: str = "Copied") -> None:
    """Say ``text`` beside ``widget`` for 1.5 s: a copy that says nothing looks like a
    click that did nothing."""
    where = widget.mapToGlobal(widget.rect().bottomLeft())
    QToolTip.showText(where, text, widget, QRect(), 1500)


def copy_button(get_text: Callable[[], str], tip: str = "Copy") -> QToolButton:
    btn = QToolButton()
    theme.set_icon(btn, "copy")
    btn.setToolTip(tip)
    btn.setCursor(Qt.CursorShape.PointingHandCursor)

    def do_copy() -> None:
        QGuiApplication.clipboard().setText(get_text())
        say_copied(btn)

    btn.clicked.connect(do_copy)
    return btn


class CopyField(QWidget):
    """A read-only text field with a copy button (URLs, keys, commands)."""

    def __init__(self, text: str = "", secret: bool = False, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.edit = QLineEdit(text)
        self.edit.setReadOnly(True)
        if secret:
            self.edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.edit.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        lay.addWidget(self.edit, 1)
        if secret:
            reveal = QToolButton()
            reveal.setText("Show")
            reveal.setCheckable(True)
            reveal.toggled.connect(
                lambda on: self.edit.setEchoMode(
                    QLineEdit.EchoMode.Normal if on else QLineEdit.EchoMode.Password
                )
            )
            lay.addWidget(reveal)
        self.copy = copy_button(self.edit.text)
        lay.addWidget(self.copy)

    def set_text(self, text: str) -> None:
        self.edit.setText(text)


def click(button: QAbstractButton) -> None:
    """Click ``button`` if enabled (automation hook and keyboard shortcuts)."""
    if button.isEnabled():
        button.click()


class ElideMiddle(QStyledItemDelegate):
    """Cells elided in the middle (``view.setItemDelegateForColumn(i, ElideMiddle(view))``):
    a path keeps its end, the file's name, where the view elides at the end."""

    def initStyleOption(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        super().initStyleOption(option, index)
        option.textElideMode = Qt.TextElideMode.ElideMiddle


def scroll_body(owner: QWidget, name: str = "") -> QVBoxLayout:
    """Give ``owner`` a frameless scroll area that fills it and return the layout of the
    area's content.  The content takes the whole room while it fits; where the window is
    smaller than what the content needs (a 1024x700 laptop), the page scrolls instead of
    squeezing its tables to no rows or clipping its buttons."""
    outer = QVBoxLayout(owner)
    outer.setContentsMargins(0, 0, 0, 0)
    area = QScrollArea()
    area.setObjectName(name or "pageScroll")
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setWidgetResizable(True)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
    body = QWidget()
    body.setObjectName("scrollBody")
    area.setWidget(body)
    outer.addWidget(area)
    return QVBoxLayout(body)


def row_button(table: QTableView, text: str, name: str, tip: str) -> QPushButton:
    """A button for a table's row (a Hub result's Download): the table's rows are made
    tall enough to show it whole, its frame included."""
    button = QPushButton(text)
    button.setObjectName(name)
    button.setToolTip(tip)
    # reached by Tab, not focused by the click: a click's focus selects the button's row
    # first, the details shown for the row move the table, and the release then lands
    # beside the button, so the click did nothing
    button.setFocusPolicy(Qt.FocusPolicy.TabFocus)
    rows = table.verticalHeader()
    need = button.sizeHint().height() + 2
    if rows.defaultSectionSize() < need:
        rows.setDefaultSectionSize(need)
    return button


def keep_rows(table: QAbstractItemView, rows: int) -> None:
    """However small the window, ``table`` keeps room for its header and ``rows`` rows
    (the page around it scrolls instead: see :func:`scroll_body`)."""
    row = table.fontMetrics().height() + 14  # a row as the theme pads it
    if isinstance(table, QTableView):
        row = max(row, table.verticalHeader().defaultSectionSize())
        header = table.horizontalHeader()
        head = header.sizeHint().height() if not header.isHidden() else 0
    else:
        head = 0
    frame = 2 * table.frameWidth()
    scroll = table.horizontalScrollBar().sizeHint().height()
    table.setMinimumHeight(head + rows * row + frame + scroll)


class ElidedButton(QPushButton):
    """A button whose text is elided at the end where the room is short ("Relaunch
    Kimi-K3 UD-I…"), never cut mid-word; :meth:`text` and the tooltip keep all of it.
    It asks for its whole text's width and accepts as little as ``least`` characters."""

    def __init__(self, text: str = "", least: int = 10) -> None:
        super().__init__(text)
        self._full = text
        self._least = least

    def text(self) -> str:  # the whole text, as set (what is drawn may be elided)
        return self._full

    def shown_text(self) -> str:
        return super().text()

    def setText(self, text: str) -> None:
        self._full = text
        self._elide()
        self.updateGeometry()

    def _chrome(self) -> int:
        """The width the style adds to the text (padding, icon, frame)."""
        return super().sizeHint().width() - self.fontMetrics().horizontalAdvance(super().text())

    def sizeHint(self) -> QSize:
        width = self._chrome() + self.fontMetrics().horizontalAdvance(self._full)
        return QSize(width, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        least = self._full[: self._least] + "…" if len(self._full) > self._least else self._full
        width = self._chrome() + self.fontMetrics().horizontalAdvance(least)
        return QSize(width, super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        # before the first layout the button has no width yet: the whole text
        laid_out = self.testAttribute(Qt.WidgetAttribute.WA_Resized)
        room = self.width() - self._chrome() if laid_out else 1 << 20
        shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, room)
        if shown != super().text():
            super().setText(shown)


class ElidedLabel(QLabel):
    """One line of text, elided at the end where the room is short (a long conversation
    title); :meth:`text` and the tooltip keep all of it."""

    def __init__(self, text: str = "", name: str = "") -> None:
        super().__init__(text)
        if name:
            self.setObjectName(name)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setToolTip(text)

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text)

    def minimumSizeHint(self) -> QSize:
        return QSize(40, super().minimumSizeHint().height())

    def shown_text(self) -> str:
        """The text as drawn at the label's width."""
        room = self.contentsRect().width()
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, room)

    def paintEvent(self, _event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setPen(self.palette().color(self.foregroundRole()))
        p.setFont(self.font())
        p.drawText(self.contentsRect(), int(self.alignment()), self.shown_text())
        p.end()
