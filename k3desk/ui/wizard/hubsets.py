"""The tiers step's "On the Hub" box: the Kimi-K3 GGUF sets the Hub has now, each judged
for this machine from its real headers, beside the catalog's tiers.

The search (:func:`k3desk.core.app.hub_choice.hub_search_op`) runs off the GUI thread as
an operation: the catalog rows are there at once, a progress line says what is being
read, and Stop cancels it.  Offline, or with the Hub unreachable, the box says that the
catalog alone is shown.  Cell texts come from :mod:`k3desk.core.app.presenters.hub_sets`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QTableWidget,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.hub_choice import hub_search_op
from k3desk.core.app.presenters.hub_sets import COLUMNS, hub_set_cells, hub_status
from k3desk.core.app.search import SearchRequest, SearchResult, SetRow
from k3desk.ui.cells import cell_item
from k3desk.ui.widgets import muted, row_button

if TYPE_CHECKING:
    from k3desk.core.app.operations import Operation
    from k3desk.core.app.values import Progress
    from k3desk.ui.context import AppContext


GET = len(COLUMNS)  # the column of each set's Download button, after the presenter's


class HubSetsBox(QWidget):
    """Signals:
    set_selected(object): the :class:`SetRow` chosen (None: the selection was cleared).
    download_wanted(object): a set's Download button: the :class:`SetRow`, chosen already.
    """

    set_selected = Signal(object)
    download_wanted = Signal(object)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.endpoint: str | None = None  # None: HF_ENDPOINT, else huggingface.co
        self.result: SearchResult | None = None
        self.searched_for: Path | bool | None = False  # the hardware file last searched for
        self._op: Operation[SearchResult] | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.status = muted("The Hub is searched when this step opens.")
        self.status.setObjectName("hubStatus")
        self.status.setWordWrap(True)
        row.addWidget(self.status, 1)
        self.stop = QPushButton("Stop")
        self.stop.setObjectName("hubStop")
        self.stop.setToolTip("Stop searching the Hub (the catalog's tiers stay)")
        self.stop.clicked.connect(self.cancel)
        self.stop.hide()
        row.addWidget(self.stop)
        self.again = QPushButton("Search the Hub")
        self.again.setObjectName("hubSearchAgain")
        self.again.setToolTip("Search the Hub again and judge each set from its real headers")
        self.again.clicked.connect(lambda: self.search(self.ctx.hardware.from_file))
        row.addWidget(self.again)
        lay.addLayout(row)
        self.table = QTableWidget(0, len(COLUMNS) + 1)
        self.table.setObjectName("hubSets")
        self.table.setHorizontalHeaderLabels([*COLUMNS, ""])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.table.setMinimumHeight(100)  # the header and about two sets
        self.table.hide()
        self.table.itemSelectionChanged.connect(self._selected)
        lay.addWidget(self.table)
        self.rows: list[SetRow] = []

    @property
    def searching(self) -> bool:
        return self._op is not None

    def search(self, hardware_file: Path | None) -> None:
        """Search the Hub for ``hardware_file`` (None: this machine) in the background."""
        self.cancel()
        self.searched_for = hardware_file
        request = SearchRequest(hardware_file=hardware_file, endpoint=self.endpoint)
        tasks = self.ctx.tasks

        def progress(p: Progress) -> None:  # on a worker thread: the label on the main one
            count = f" {p.done}/{p.total}" if p.total else ""
            text = f"{p.stage}{count}: {p.detail[-70:]}…" if p.detail else f"{p.stage}{count}…"
            tasks.run_on_main(lambda: self._progress(op, text))

        op = hub_search_op(self.ctx.services, request, progress)
        self._op = op
        self.status.setText("Searching the Hub for Kimi-K3 GGUF sets…")
        self.stop.show()
        self.again.setEnabled(False)

        def done(result: SearchResult) -> None:
            if self._op is op:
                self.show_result(result)

        def failed(exc: BaseException) -> None:
            if self._op is op:
                self.status.setText(
                    f"Catalog only: the Hub search failed ({exc}). The tiers above are the "
                    "catalog's."
                )

        def ended() -> None:
            if self._op is op:
                self._op = None
                self.stop.hide()
                self.again.setEnabled(True)

        self.ctx.ops.run(op, on_success=done, on_failure=failed, on_finally=ended)

    def cancel(self) -> None:
        """Stop the search now: its answer, should one still come, is dropped."""
        op, self._op = self._op, None
        if op is None:
            return
        op.cancel()
        self.stop.hide()
        self.again.setEnabled(True)
        self.status.setText(
            "Hub search stopped: the catalog's tiers are shown. Search the Hub to try again."
        )

    def _progress(self, op: Operation[SearchResult], text: str) -> None:
        if self._op is op:  # a report that arrives after the answer is dropped
            self.status.setText(text)

    def show_result(self, result: SearchResult) -> None:
        self.result = result
        self.status.setText(hub_status(result))
        self.rows = list(result.rows) if not result.offline else []
        self.table.blockSignals(True)
        self.table.clearSelection()
        self.table.setRowCount(len(self.rows))
        for r, row in enumerate(self.rows):
            for c, cell in enumerate(hub_set_cells(row)):
                self.table.setItem(r, c, cell_item(cell))
            self.table.setCellWidget(r, GET, self._get_button(r, row))
        self.table.blockSignals(False)
        self.table.setVisible(bool(self.rows))
        self.set_selected.emit(None)

    def _get_button(self, r: int, row: SetRow) -> QPushButton:
        tip = f"Choose {row.remote.name} and go on to download it with its vision projector"
        button = row_button(self.table, "Download", "hubSetDownload", tip)
        button.clicked.connect(lambda _checked=False, i=r: self._get(i))
        return button

    def _get(self, r: int) -> None:
        """A set's Download button: the set chosen, then the wizard goes on with it."""
        self.table.selectRow(r)
        row = self.current()
        if row is not None:
            self.download_wanted.emit(row)

    def clear_selection(self) -> None:
        self.table.blockSignals(True)
        self.table.clearSelection()
        self.table.blockSignals(False)

    def current(self) -> SetRow | None:
        rows = {i.row() for i in self.table.selectedIndexes()}
        return self.rows[min(rows)] if rows and min(rows) < len(self.rows) else None

    def select_set(self, repo: str, name: str) -> None:
        for r, row in enumerate(self.rows):
            if row.repo == repo and row.remote.name == name:
                self.table.selectRow(r)
                return

    def texts(self) -> list[list[str]]:
        """The table's text, row by row (what a person reads; the buttons apart)."""
        out = []
        for i in range(self.table.rowCount()):
            cells = (self.table.item(i, j) for j in range(len(COLUMNS)))
            out.append([c.text() if c is not None else "" for c in cells])
        return out

    def _selected(self) -> None:
        self.set_selected.emit(self.current())
