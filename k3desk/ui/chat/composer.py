"""The composer: the text box (Enter sends, Shift+Enter new line, Esc stops), image
attachments (button, drag-and-drop, paste) shown as removable thumbnails, Send/Stop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData, QSize, Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QImage, QKeyEvent, QPixmap
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.chat import PreparedImage
from k3desk.ui import theme
from k3desk.ui.widgets import label, primary, set_enabled

IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.gif *.webp);;All files (*)"


@dataclass
class Attachment:
    image: PreparedImage
    thumb: QImage


def image_to_png(image: QImage) -> bytes:
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buf, "PNG")  # type: ignore[call-overload]
    buf.close()
    return bytes(data.data())


class ComposerEdit(QPlainTextEdit):
    """Signals:
    send(): Enter pressed.  stop(): Esc pressed.  files(list): files pasted.
    image_data(bytes, str): image pasted (PNG bytes, a name).
    """

    send = Signal()
    stop = Signal()
    files = Signal(list)
    image_data = Signal(bytes, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("composerEdit")
        self.setTabChangesFocus(True)
        self.setPlaceholderText("Message Kimi-K3…  (Enter sends, Shift+Enter for a new line)")

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if e.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")
            else:
                self.send.emit()
            return
        if e.key() == Qt.Key.Key_Escape:
            self.stop.emit()
            return
        super().keyPressEvent(e)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return source.hasImage() or source.hasUrls() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        if source.hasImage():
            img = QImage(source.imageData())
            if not img.isNull():
                self.image_data.emit(image_to_png(img), "pasted image")
                return
        if source.hasUrls():
            paths = [u.toLocalFile() for u in source.urls() if u.isLocalFile()]
            if paths:
                self.files.emit(paths)
                return
        super().insertFromMimeData(source)

    def dragEnterEvent(self, e: QDragEnterEvent) -> None:
        if e.mimeData().hasUrls() or e.mimeData().hasImage():
            e.acceptProposedAction()
        else:
            super().dragEnterEvent(e)

    def dropEvent(self, e: QDropEvent) -> None:
        md = e.mimeData()
        if md.hasUrls() or md.hasImage():
            self.insertFromMimeData(md)
            e.acceptProposedAction()
            return
        super().dropEvent(e)


class Thumb(QFrame):
    removed = Signal(object)

    def __init__(self, att: Attachment, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("thumb")
        self.attachment = att
        lay = QHBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        pic = QLabel()
        pic.setPixmap(
            QPixmap.fromImage(att.thumb).scaled(
                QSize(56, 56),
                Qt.AspectRatioMode.KeepAspectRatio,
                Qt.TransformationMode.SmoothTransformation,
            )
        )
        lay.addWidget(pic)
        name = att.image.name.rsplit("/", 1)[-1]
        text = label(f"{name[:22]}\n{att.image.width}×{att.image.height}", wrap=False)
        text.setProperty("muted", True)
        lay.addWidget(text)
        rm = QToolButton()
        rm.setText("✕")
        rm.setToolTip(f"Remove {name}")
        rm.setObjectName("removeAttachment")
        rm.clicked.connect(lambda: self.removed.emit(self))
        lay.addWidget(rm, 0, Qt.AlignmentFlag.AlignTop)


class Composer(QFrame):
    """Signals:
    send_requested(str): the text to send (attachments are read from :attr:`attachments`).
    stop_requested(): Esc or the Stop button.
    files_added(list): paths chosen, dropped or pasted.
    image_pasted(bytes, str): PNG data pasted or dropped.
    """

    send_requested = Signal(str)
    stop_requested = Signal()
    files_added = Signal(list)
    image_pasted = Signal(bytes, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("composer")
        self.setAcceptDrops(True)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.attachments: list[Attachment] = []
        # where "Attach images" opens (the page sets it: the pictures folder)
        self.start_folder: Callable[[], str] | None = None
        outer = QVBoxLayout(self)
        outer.setContentsMargins(8, 6, 8, 8)
        outer.setSpacing(4)
        self.notice = label("")
        self.notice.setObjectName("warnText")
        self.notice.hide()
        outer.addWidget(self.notice)
        # the action a refusal offers (an image refused for a set without its projector)
        self.action = QPushButton("")
        self.action.setObjectName("noticeAction")
        self.action.hide()
        self.action.clicked.connect(self._act)
        self._on_action: Callable[[], None] | None = None
        outer.addWidget(self.action, 0, Qt.AlignmentFlag.AlignLeft)
        self.strip = QWidget()
        self.strip_lay = QHBoxLayout(self.strip)
        self.strip_lay.setContentsMargins(0, 0, 0, 0)
        self.strip_lay.addStretch(1)
        self.strip.hide()
        outer.addWidget(self.strip)
        self.edit = ComposerEdit()
        self.edit.setMinimumHeight(44)
        self.edit.setMaximumHeight(80)
        self.edit.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Maximum)
        outer.addWidget(self.edit)
        row = QHBoxLayout()
        self.attach = QToolButton()
        self.attach.setObjectName("attachButton")
        theme.set_icon(self.attach, "attach")
        self.attach.setIconSize(QSize(20, 20))
        self.attach.setToolTip("Attach images (or drop / paste them here)")
        row.addWidget(self.attach)
        # wraps: at 1024 px the reason nothing can be sent is longer than the row
        self.hint = label("", wrap=True)
        self.hint.setObjectName("composerHint")
        self.hint.setProperty("muted", True)
        self.hint.setMinimumWidth(1)
        row.addWidget(self.hint, 1)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setObjectName("stopButton")
        theme.set_icon(self.stop_btn, "stop")
        self.stop_btn.hide()
        row.addWidget(self.stop_btn)
        self.send_btn = primary(QPushButton("Send"))
        self.send_btn.setObjectName("sendButton")
        row.addWidget(self.send_btn)
        outer.addLayout(row)

        self.edit.send.connect(self._send)
        self.edit.stop.connect(self.stop_requested)
        self.edit.files.connect(self.files_added)
        self.edit.image_data.connect(self.image_pasted)
        self.send_btn.clicked.connect(self._send)
        self.stop_btn.clicked.connect(self.stop_requested)
        self.attach.clicked.connect(self._choose)
        self.edit.textChanged.connect(self._update)
        self._can_send = True
        self._why_not = ""
        self._streaming = False
        self._update()

    # ------------------------------------------------------------ state
    def set_availability(self, can_send: bool, why_not: str = "") -> None:
        self._can_send = can_send
        self._why_not = why_not
        self._update()

    def set_streaming(self, streaming: bool) -> None:
        self._streaming = streaming
        self.stop_btn.setVisible(streaming)
        self.send_btn.setVisible(not streaming)
        self._update()

    def _update(self) -> None:
        has_content = bool(self.edit.toPlainText().strip() or self.attachments)
        if self._streaming:
            why = "Wait for the answer to finish, or press Stop (Esc)."
        elif not self._can_send:
            why = self._why_not
        elif not has_content:
            why = "Type a message or attach an image first."
        else:
            why = ""
        set_enabled(self.send_btn, not why, why, "Send (Enter)")
        self.hint.setText(self._why_not if not self._can_send else "")

    def show_notice(self, text: str, warn: bool = True) -> None:
        """``text`` above the message box: in the warning colour, or (``warn`` False:
        news that asks nothing of the person, such as a conversation resumed or a model
        loading) in the muted one."""
        tone = "warnText" if warn else "muted"
        if self.notice.objectName() != tone:
            self.notice.setObjectName(tone)
            self.notice.style().polish(self.notice)
        self.notice.setText(text)
        self.notice.setVisible(bool(text))
        self.offer("", None)  # a new notice: the last one's action goes with it

    def offer(self, text: str, action: Callable[[], None] | None) -> None:
        """A button under the notice doing ``action`` (None: no button)."""
        self._on_action = action
        self.action.setText(text)
        self.action.setVisible(action is not None)

    def _act(self) -> None:
        action, self._on_action = self._on_action, None
        self.action.hide()
        if action is not None:
            action()

    # ------------------------------------------------------- attachments
    def add_attachment(self, image: PreparedImage, thumb: QImage) -> None:
        att = Attachment(image, thumb)
        self.attachments.append(att)
        t = Thumb(att)
        t.removed.connect(self._remove)
        self.strip_lay.insertWidget(self.strip_lay.count() - 1, t)
        self.strip.show()
        self.show_notice("")
        self._update()

    def _remove(self, thumb: Thumb) -> None:
        if thumb.attachment in self.attachments:
            self.attachments.remove(thumb.attachment)
        thumb.setParent(None)
        thumb.deleteLater()
        self.strip.setVisible(bool(self.attachments))
        self._update()

    def thumbs(self) -> list[Thumb]:
        return [t for t in self.strip.findChildren(Thumb) if t.attachment in self.attachments]

    def clear(self) -> None:
        self.edit.clear()
        for t in self.thumbs():
            self._remove(t)

    def _choose(self) -> None:
        start = self.start_folder() if self.start_folder is not None else ""
        files, _ = QFileDialog.getOpenFileNames(self, "Attach images", start, IMAGE_FILTER)
        if files:
            self.files_added.emit(files)

    def _send(self) -> None:
        if self.send_btn.isEnabled() and not self._streaming:
            self.send_requested.emit(self.edit.toPlainText().strip())

    # ------------------------------------------------------ drop on frame
    def dragEnterEvent(self, e: QDragEnterEvent) -> None:
        if e.mimeData().hasUrls() or e.mimeData().hasImage():
            e.acceptProposedAction()

    def dropEvent(self, e: QDropEvent) -> None:
        self.edit.insertFromMimeData(e.mimeData())
        e.acceptProposedAction()
