"""The Models page's "My models": GGUF sets already on disk (added here, dropped on the window,
added with ``k3desk models add``, or found in the model folders of Settings), each with its
verdict for the machine the page judges, and "Chat with it", which plans the set for this
machine, launches it and opens the chat.

Everything shown comes from :mod:`k3desk.core.app.library`; the launch is the Engine page's
(:func:`k3desk.ui.engine.controller.prepare_engine_request`), which always plans for this machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QStandardPaths, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app import actions
from k3desk.core.app.library import ModelRow, ModelsJudgement
from k3desk.core.app.operations import Change, OpChanges, Operation
from k3desk.core.app.presenters.my_models import (
    COLUMNS,
    EMPTY,
    added_text,
    row_cells,
    summary_text,
)
from k3desk.core.app.tiers import plan_label
from k3desk.ui.cells import cell_item
from k3desk.ui.errors import describe
from k3desk.ui.pages import Navigator, PageKey
from k3desk.ui.widgets import label, muted, primary, set_enabled

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext
    from k3desk.ui.engine.controller import LaunchRequest

MAX_ROWS_SHOWN = 4


class MyModels(QWidget):
    """Signals:
    changed(object): the ModelsJudgement now shown.
    """

    changed = Signal(object)

    def __init__(self, ctx: AppContext, nav: Navigator | None = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.nav = nav
        self.hardware = ctx.hardware
        self.judgement: ModelsJudgement | None = None
        self._gen = 0
        self._launching: Any = None
        self._note = ""  # what the last action did (kept above the list's summary)
        self._summary = EMPTY
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        head.addWidget(label("My models", "sectionTitle", wrap=False))
        head.addStretch(1)
        self.add_file = QPushButton("Add a model…")
        self.add_file.setObjectName("addModelFile")
        self.add_file.setToolTip("A .gguf file: any part of a shard set")
        self.add_folder = QPushButton("Add a folder…")
        self.add_folder.setObjectName("addModelFolder")
        self.add_folder.setToolTip("A folder of .gguf shard sets (folders inside it too)")
        self.remove_btn = QPushButton("Remove")
        self.remove_btn.setObjectName("removeModel")
        self.chat_btn = primary(QPushButton("Chat with it"))
        self.chat_btn.setObjectName("chatWithModel")
        for b in (self.add_file, self.add_folder, self.remove_btn, self.chat_btn):
            head.addWidget(b)
        lay.addLayout(head)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("myModels")
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # a folder keeps its end
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)
        self.table.hide()  # shown with the first model (the status line says how to add one)
        lay.addWidget(self.table)
        self.status = muted(EMPTY)
        self.status.setObjectName("myModelsStatus")
        lay.addWidget(self.status)
        self.add_file.clicked.connect(self.choose_file)
        self.add_folder.clicked.connect(self._choose_folder)
        self.remove_btn.clicked.connect(self.remove_selected)
        self.chat_btn.clicked.connect(self.chat_selected)
        self.table.itemSelectionChanged.connect(self._buttons)
        self.table.itemDoubleClicked.connect(lambda _i: self.chat_selected())
        self.hardware.judged.connect(lambda _j: self.refresh())
        ctx.settings_changed.connect(lambda _s: self.refresh())
        ctx.ops.did_execute.connect(self._changed)
        ctx.engine.state_changed.connect(lambda _s, _m: self._buttons())
        self._buttons()

    # ------------------------------------------------------------ listing
    def refresh(self) -> None:
        """List and judge every local model for the machine the page judges."""
        hw, subject = self.hardware.profile, self.hardware.subject
        if hw is None or subject is None:
            return  # judged once the machine is known (hardware.judged)
        self._gen += 1
        gen = self._gen

        def done(judged: ModelsJudgement) -> None:
            if gen == self._gen:
                self.show_judgement(judged)

        def error(exc: BaseException) -> None:
            if gen == self._gen:
                self.say(describe(exc)[0])
                self.ctx.reporter.report(exc)

        op = actions.list_models(self.ctx.services, hw, subject, self.ctx.settings.ctx)
        self.ctx.ops.run(op, on_success=done, on_failure=error)

    def _changed(self, changes: OpChanges, _initiator: object) -> None:
        if changes.touches(Change.MODELS):  # added, removed (here, or dropped on the window)
            self.refresh()

    def show_judgement(self, judged: ModelsJudgement) -> None:
        keep = self.current()
        self.judgement = judged
        self.table.blockSignals(True)
        self.table.clearSelection()
        self.table.setRowCount(len(judged.rows))
        for r, row in enumerate(judged.rows):
            for col, cell in enumerate(row_cells(row)):
                self.table.setItem(r, col, cell_item(cell))
        self.table.blockSignals(False)
        self._fit_height(len(judged.rows))
        self._summary = summary_text(judged)
        self._show_status()
        ids = [r.model.id for r in judged.rows]
        if keep is not None and keep.model.id in ids:
            self.table.selectRow(ids.index(keep.model.id))
        elif ids:
            self.table.selectRow(0)
        self._buttons()
        self.changed.emit(judged)

    def _fit_height(self, n: int) -> None:
        """As tall as its rows, up to four (the published tiers below keep the room)."""
        self.table.setVisible(n > 0)
        if not n:
            return
        self.table.resizeRowsToContents()
        rows = sum(self.table.rowHeight(r) for r in range(min(MAX_ROWS_SHOWN, n)))
        header = self.table.horizontalHeader().sizeHint().height()
        self.table.setFixedHeight(header + rows + 2 * self.table.frameWidth() + 2)

    def say(self, note: str) -> None:
        """Tell what the last action did (until the next one)."""
        self._note = note
        self._show_status()

    def _show_status(self) -> None:
        self.status.setText(" ".join(t for t in (self._note, self._summary) if t))

    def rows(self) -> list[ModelRow]:
        return list(self.judgement.rows) if self.judgement is not None else []

    def current(self) -> ModelRow | None:
        sel = {i.row() for i in self.table.selectedIndexes()}
        rows = self.rows()
        return rows[min(sel)] if sel and min(sel) < len(rows) else None

    def select(self, key: str) -> None:
        for r, row in enumerate(self.rows()):
            if key in (row.model.id, str(row.model.shard)):
                self.table.selectRow(r)
                return

    def shown_rows(self) -> list[dict[str, Any]]:
        """The rows as the table shows them (the automation hook's ``models``)."""
        out = []
        for r, row in enumerate(self.rows()):
            cells = {
                COLUMNS[c].lower(): (self.table.item(r, c) or QTableWidgetItem()).text()
                for c in range(len(COLUMNS))
            }
            out.append({"id": row.model.id, "shard": str(row.model.shard), **cells})
        return out

    # ------------------------------------------------------------ adding
    def _start_dir(self) -> str:
        s = self.ctx.settings
        if s.model_dirs:
            return s.model_dirs[0]
        return QStandardPaths.writableLocation(QStandardPaths.StandardLocation.HomeLocation)

    def choose_file(self) -> None:
        f, _ = QFileDialog.getOpenFileName(
            self, "Add a model", self._start_dir(), "GGUF model (*.gguf);;All files (*)"
        )
        if f:
            self.add_paths([Path(f)])

    def _choose_folder(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Add a folder of models", self._start_dir())
        if d:
            self.add_paths([Path(d)])

    def add_paths(self, paths: Sequence[Path]) -> None:
        """Add each path (file or folder); each refusal is reported with its reason."""
        self.say("Reading the headers of " + ", ".join(p.name for p in paths) + "…")

        def finished(out: actions.AddOutcome) -> None:
            for exc in out.failed:
                self.ctx.reporter.report(exc)
            said = [added_text(a) for a in out.added] + [describe(e)[0] for e in out.failed]
            self.say(" ".join(said))
            if not out.changed:
                self.refresh()  # nothing to announce: the list is shown again all the same
            if out.added and out.added[-1].added:
                self._select_after = out.added[-1].added[0].id

        self._select_after = ""
        self.changed.connect(self._after_add)
        self.ctx.ops.run(actions.add_models(self.ctx.services, paths), on_success=finished)

    def _after_add(self, _judged: object) -> None:
        self.changed.disconnect(self._after_add)
        if self._select_after:
            self.select(self._select_after)

    def remove_selected(self) -> None:

        row = self.current()
        if row is None:
            return

        def failed(exc: BaseException) -> None:
            self.say(describe(exc)[0])
            self.ctx.reporter.report(exc)

        self.ctx.ops.run(
            actions.remove_model(self.ctx.services, row.model.id),
            on_success=lambda removed: self.say(
                f"Removed {removed} from your models (the files stay)."
            ),
            on_failure=failed,
        )

    # ------------------------------------------------------------ chatting
    def chat_selected(self) -> None:
        """Plan the selected set for this machine, launch it, and open the chat."""
        from k3desk.core.app.launch import SlowLaunchError
        from k3desk.ui.engine.controller import prepare_engine_request
        from k3desk.ui.engine.page import confirm_slow_launch

        row = self.current()
        if row is None or not row.model.ok or self._launching is not None:
            return
        m = row.model
        ctx = self.ctx
        if self._already_loaded(m.shard, m.name):
            self.say(f"{m.name} is already running: the chat talks to it.")
            if self.nav is not None:
                self.nav.show_page(PageKey.CHAT)
            return
        self.say(f"Checking {m.name} and planning it for this machine…")

        def done(req: LaunchRequest) -> None:
            from k3desk.ui.model_switch import switch_to

            self._launching = None
            # another model running is stopped only when the person says so
            if switch_to(self, ctx.engine, req) is None:
                self.say(f"{ctx.engine.model_name()} keeps running; {m.name} was not loaded.")
                self._buttons()
                return
            how = f" ({plan_label(req.plan)})" if req.plan is not None else ""
            self.say(f"Loading {m.name} on this machine{how}…")
            if self.nav is not None:
                self.nav.show_page(PageKey.CHAT)
            self._buttons()

        def error(exc: BaseException) -> None:
            self._launching = None
            slow = confirm_slow_launch(self, exc)
            if slow is not None:
                done(slow)
                return
            self.say(describe(exc)[0])
            if slow is None and not isinstance(exc, SlowLaunchError):
                ctx.reporter.report(exc)
            self._buttons()

        self._launching = ctx.ops.run(
            Operation(
                "prepare-launch", lambda t: prepare_engine_request(ctx, m.shard, m.projector, t)
            ),
            on_success=done,
            on_failure=error,
        )
        self._buttons()

    def _already_loaded(self, shard: Path, name: str) -> bool:
        """``shard`` is what the local engine runs (or loads) now."""
        engine = self.ctx.engine
        if not engine.running:
            return False
        req = engine.request
        if engine.background is not None:
            return engine.model_name() == name
        return req is not None and req.shard is not None and req.shard == shard

    def _buttons(self) -> None:
        row = self.current()
        none = "Select one of your models first."
        set_enabled(
            self.remove_btn,
            row is not None and row.model.source == "added",
            none
            if row is None
            else "Found in a model folder of Settings: remove the folder there.",
            "Take it off the list (the files stay where they are)",
        )
        why = (
            none
            if row is None
            else f"It cannot be used: {row.model.problem}"
            if not row.model.ok
            else "Checking and planning it…"
            if self._launching is not None
            else ""
        )
        set_enabled(
            self.chat_btn,
            not why,
            why,
            "Plan it for this machine, start llama-server with it, and open the chat",
        )
