"""'On the Hub' on the Models page: the Kimi-K3 GGUF sets the Hub has now, each judged.

A search runs :func:`k3desk.core.app.search.search_hub` off the GUI thread: every set is
judged for the machine the page judges (this one or a loaded hardware file) from its
real headers, read by ranges before any download, or from the catalog where it is a
tier's files; the table says which.  Offline, or with the Hub unreachable, it shows the
catalog alone and says "catalog only (offline)".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.hub_choice import projector_note, set_download
from k3desk.core.app.search import (
    SearchRequest,
    SearchResult,
    SetRow,
    search_hub,
    shown,
    size_text,
)
from k3desk.ui.pages import PageKey
from k3desk.ui.widgets import label, muted, row_button

if TYPE_CHECKING:
    from k3desk.core.app.values import CancelToken, Progress
    from k3desk.ui.context import AppContext
    from k3desk.ui.pages import Navigator

COLUMNS = ("Repository", "Set", "Parts", "Size", "Tier", "Fit", "Judged from", "")
GET = len(COLUMNS) - 1  # the column of each set's Download button


class HubModels(QWidget):
    """A search box, a status line and one row per set on the Hub."""

    def __init__(
        self, ctx: AppContext, nav: Navigator | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.nav = nav
        self.result: SearchResult | None = None
        self._searching = False
        self.endpoint: str | None = None  # None: HF_ENDPOINT, else huggingface.co
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 8, 0, 0)
        row = QHBoxLayout()
        self.query = QLineEdit("Kimi-K3")
        self.query.setObjectName("hubQuery")
        self.query.returnPressed.connect(self.search)
        row.addWidget(self.query, 1)
        self.button = QPushButton("Search the Hub")
        self.button.setObjectName("hubSearch")
        self.button.setToolTip(
            "Find Kimi-K3 GGUF sets on the Hub and judge each from its real headers "
            "(a few MB per set, read before any download)"
        )
        self.button.clicked.connect(self.search)
        row.addWidget(self.button)
        lay.addLayout(row)
        self.status = muted(
            "Search to see every Kimi-K3 GGUF set the Hub has, judged from its real headers."
        )
        self.status.setObjectName("hubStatus")
        lay.addWidget(self.status)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("hubTable")
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(5, QHeaderView.ResizeMode.Stretch)
        self.table.setMinimumHeight(140)
        self.table.itemSelectionChanged.connect(self._selected)
        lay.addWidget(self.table, 1)
        self.details = label("", "hubDetails", selectable=True)
        lay.addWidget(self.details)

    def search(self) -> None:
        hardware = self.ctx.hardware.from_file
        request = SearchRequest(
            query=self.query.text().strip() or "Kimi-K3",
            hardware_file=hardware,
            endpoint=self.endpoint,
        )
        services = self.ctx.services
        self.button.setEnabled(False)
        self._searching = True
        self.status.setText("Searching the Hub and reading each set's headers…")

        tasks = self.ctx.tasks

        def progress(p: Progress) -> None:  # on a worker thread: the label on the main one
            count = f" {p.done}/{p.total}" if p.total else ""
            text = f"{p.stage}{count} {p.detail[-80:]}…"
            tasks.run_on_main(lambda: self._progress(text))

        def work(token: CancelToken) -> SearchResult:
            return search_hub(services, request, progress=progress, cancel=token)

        def done(result: SearchResult) -> None:
            self.show_result(result)

        def failed(exc: BaseException) -> None:
            self._searching = False
            self.status.setText(f"The search failed: {exc}")

        self.ctx.tasks.run(
            work,
            on_done=done,
            on_error=failed,
            on_finally=lambda: self.button.setEnabled(True),
            name="hub search",
        )

    def _progress(self, text: str) -> None:
        if self._searching:  # a report that arrives after the answer is dropped
            self.status.setText(text)

    def show_result(self, result: SearchResult) -> None:
        self._searching = False
        self.result = result
        machine = result.subject.describe()
        self.status.setText(
            f"{result.status[:1].upper()}{result.status[1:]}; judged for {machine}."
        )
        if result.offline:
            rows = [
                (r.tier.repo, r.tier.name, str(r.tier.shard_count), size_text(r.tier.size_bytes),
                 r.tier.id, r.label, "catalog only (offline)")
                for r in result.catalog.rows
            ]  # fmt: skip
        else:
            rows = []
            for s in result.rows:
                fit = s.verdict
                if s.kind == "hybrid" and s.n_cpu_moe:
                    fit += f" (--n-cpu-moe {s.n_cpu_moe})"
                if s.speed:
                    fit += f", ~{s.speed}"
                rows.append(
                    (f"{shown(s.repo)}@{shown(s.revision[:7])}", shown(s.remote.name),
                     str(s.remote.count),
                     size_text(s.remote.total_bytes), s.tier.id if s.tier else "-", fit,
                     s.basis_text())
                )  # fmt: skip
        notes = [self._notes(s) for s in result.rows] if not result.offline else []
        self.table.setRowCount(len(rows))
        for i, cells in enumerate(rows):
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip("\n".join([text, *notes[i]]) if notes else text)
                self.table.setItem(i, j, item)
            if not result.offline:
                self.table.setCellWidget(i, GET, self._get_button(result.rows[i]))

    def _get_button(self, row: SetRow) -> QPushButton:
        tip = (
            f"Download {row.remote.name} from {row.repo} at {row.revision[:7]} with its "
            "vision projector, verified, into the models folder"
        )
        button = row_button(self.table, "Download", "hubDownload", tip)
        button.clicked.connect(lambda _checked=False, r=row: self.download(r))
        return button

    def download(self, row: SetRow) -> None:
        """Start the download the wizard makes for ``row`` (its parts and its projector,
        into the models folder), and show it on the Downloads page."""
        chosen = set_download(self.ctx.services, row)
        try:
            self.ctx.downloads.start(chosen.request, chosen.target)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.ctx.reporter.report(exc)
            return
        self.details.setText(f"Downloading {row.remote.name} to {chosen.target}. {chosen.note}")
        if self.nav is not None:
            self.nav.show_page(PageKey.DOWNLOADS)

    def _selected(self) -> None:
        """The chosen set's judgement in full, and how to get it."""
        result = self.result
        rows = self.table.selectionModel().selectedRows()
        if result is None or result.offline or not rows or rows[0].row() >= len(result.rows):
            self.details.setText("")
            return
        s = result.rows[rows[0].row()]
        lines = [
            f"{shown(s.repo)} at {shown(s.revision[:12])}, {shown(s.remote.name)}: {s.verdict}"
        ]
        if s.plan is not None:
            lines.append(s.plan.basis_text()[:1].upper() + s.plan.basis_text()[1:] + ".")
        lines += [shown(s.problem, 600)] if s.problem else []
        lines += [shown(x, 300) for x in s.suspicious[:1]]
        lines.append(
            f"Download: k3desk download --repo {s.repo} --revision {s.revision} "
            f"--include '{shown(s.remote.include)}'"
        )
        self.details.setText("\n".join(lines))

    @staticmethod
    def _notes(row: SetRow) -> list[str]:
        """The card's facts for a set that is a catalog tier, and what stopped a judgement."""
        out = [shown(row.problem, 600)] if row.problem else []
        out += [shown(x, 300) for x in row.suspicious[:4]]
        if row.tier is not None:
            out += [f"{q.metric}: {q.value} ({q.conditions})" for q in row.tier.quality[:3]]
            out += list(row.tier.caveats[:3])
            if row.tier.vision_engine:
                out.append(f"Images need the {row.tier.vision_engine} llama.cpp fork.")
        if row.projectors:
            out.append("Projectors in the repository: " + ", ".join(row.projectors))
        out.append(projector_note(row.tier))
        return out

    def rows(self) -> list[list[str]]:
        """The table's text, row by row (what a person reads)."""
        out = []
        for i in range(self.table.rowCount()):
            cells = (self.table.item(i, j) for j in range(self.table.columnCount()))
            out.append([c.text() if c is not None else "" for c in cells])
        return out
