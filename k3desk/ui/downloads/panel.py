"""One download on screen: total and per-shard progress, speed, ETA, verification,
and Pause / Resume / Cancel."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.presenters.downloads import (
    FILE_COLUMNS,
    NO_DOWNLOAD,
    file_rows,
    fmt_eta,
    notes,
    numbers_text,
    title_text,
    where_text,
)
from k3desk.core.app.values import fmt_bytes
from k3desk.ui.downloads.controller import DownloadsController, DownloadState
from k3desk.ui.widgets import Banner, label, muted, set_enabled

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext

__all__ = ["DownloadPanel", "fmt_eta"]  # fmt_eta: still importable from here


class DownloadPanel(QWidget):
    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.downloads: DownloadsController = ctx.downloads
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.title = label("No download yet.", "sectionTitle")
        lay.addWidget(self.title)
        self.where = muted("")
        lay.addWidget(self.where)
        self.total = QProgressBar()
        self.total.setObjectName("totalProgress")
        self.total.setRange(0, 1000)
        self.total.setFormat("%p%")
        lay.addWidget(self.total)
        self.numbers = QLabel("")
        self.numbers.setObjectName("downloadNumbers")
        lay.addWidget(self.numbers)
        self.banner = Banner()
        lay.addWidget(self.banner)
        self.table = QTableWidget(0, 4)
        self.table.setObjectName("shardTable")
        self.table.setHorizontalHeaderLabels(list(FILE_COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        h.setSectionResizeMode(1, QHeaderView.ResizeMode.Fixed)
        h.resizeSection(1, 200)
        h.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(3, QHeaderView.ResizeMode.ResizeToContents)
        lay.addWidget(self.table, 1)
        row = QHBoxLayout()
        row.addStretch(1)
        self.pause_btn = QPushButton("Pause")
        self.pause_btn.setObjectName("pauseDownload")
        self.resume_btn = QPushButton("Resume")
        self.resume_btn.setObjectName("resumeDownload")
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.setObjectName("cancelDownload")
        self.cancel_btn.setProperty("danger", True)
        for b in (self.pause_btn, self.resume_btn, self.cancel_btn):
            row.addWidget(b)
        lay.addLayout(row)
        self.pause_btn.clicked.connect(self.downloads.pause)
        self.resume_btn.clicked.connect(self.downloads.resume)
        self.cancel_btn.clicked.connect(self._cancel)
        self.downloads.changed.connect(self.show_state)
        self._bars: dict[str, QProgressBar] = {}
        self.show_state(self.downloads.state)

    def _cancel(self) -> None:
        if self.downloads.running:
            self.downloads.cancel()
            return
        st = self.downloads.state
        if st is None or not self.downloads.discardable:
            return
        name = st.request.label or st.request.repo
        answer = QMessageBox.question(
            self,
            "Discard the download",
            f"Delete what was downloaded of {name} so far ({fmt_bytes(st.done)}) and forget "
            "it? Files already verified stay.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.downloads.discard()

    def show_state(self, st: DownloadState | None) -> None:
        running = self.downloads.running
        set_enabled(
            self.pause_btn,
            running,
            "Nothing is downloading.",
            "Stop now; partial data is kept and Resume continues from it",
        )
        can_resume = st is not None and not running and st.status in ("paused", "failed")
        set_enabled(self.resume_btn, can_resume, "Only a paused or failed download can be resumed.")
        # a paused or failed download can be discarded too (its partial data deleted)
        discard = not running and self.downloads.discardable
        self.cancel_btn.setText("Discard" if discard else "Cancel")
        set_enabled(
            self.cancel_btn,
            running or self.downloads.discardable,
            "Nothing to cancel or discard.",
            "Stop and delete the partial files"
            if running
            else "Delete the partial files of this download and forget it",
        )
        if st is None:
            self.title.setText(NO_DOWNLOAD[0])
            self.where.setText(NO_DOWNLOAD[1])
            self.total.setValue(0)
            self.numbers.setText("")
            return
        self.title.setText(title_text(st))
        self.where.setText(where_text(st))
        self.total.setValue(int(st.fraction * 1000))
        self.numbers.setText(numbers_text(st))
        self.banner.show_text("<br/>".join(notes(st)))
        self._fill(st)

    def _fill(self, st: DownloadState) -> None:
        rows = file_rows(st)
        if self.table.rowCount() != len(rows):
            self.table.setRowCount(len(rows))
            self._bars.clear()
        for i, r in enumerate(rows):
            item = self.table.item(i, 0)
            if item is None or item.text() != r.path:
                self.table.setItem(i, 0, QTableWidgetItem(r.path))
                bar = QProgressBar()
                bar.setRange(0, 1000)
                bar.setTextVisible(True)
                self.table.setCellWidget(i, 1, bar)
                self._bars[r.path] = bar
            cell = self._bars.get(r.path) or self.table.cellWidget(i, 1)
            if isinstance(cell, QProgressBar):
                cell.setValue(r.permille)
            self.table.setItem(i, 2, QTableWidgetItem(r.size.text))
            state = QTableWidgetItem(r.state.text)
            state.setToolTip(r.state.tooltip)
            state.setTextAlignment(Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft)
            self.table.setItem(i, 3, state)
