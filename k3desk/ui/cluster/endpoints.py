"""Attached servers: any OpenAI-compatible URL (a vLLM TP3 server, a SparkInfer bridge,
another machine's llama-server) that the chat then talks to like the local engine.

The URL is checked when attached, and what kind of server it is (llama-server, a
SparkInfer bridge, vLLM, another OpenAI-compatible one) is found out, shown and kept
with it; the person can say otherwise.  The key goes through the core's endpoint store
(the system keyring, or an environment variable the endpoint names), never into
a settings file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.chat import DIALECT_IDS, DIALECTS
from k3desk.core.app.endpoints import EndpointStatus, RemoteEndpoint
from k3desk.core.app.operations import Change, OpChanges
from k3desk.core.app.presenters.endpoints import ENDPOINT_COLUMNS, endpoint_cells
from k3desk.core.app.values import K3Error
from k3desk.ui.cells import cell_item
from k3desk.ui.widgets import Card, label, muted, primary, set_enabled

if TYPE_CHECKING:
    from k3desk.ui.cluster.controller import ClusterController
    from k3desk.ui.context import AppContext


AUTO = "Found by k3desk"


def server_box(name: str) -> QComboBox:
    """Auto, then every kind of server k3desk speaks to (the data is the kind's id)."""
    box = QComboBox()
    box.setObjectName(name)
    box.addItem(AUTO, "")
    for d in DIALECT_IDS:
        box.addItem(DIALECTS[d].label, d)
        box.setItemData(box.count() - 1, DIALECTS[d].differs, Qt.ItemDataRole.ToolTipRole)
    return box


class EndpointsPanel(QWidget):
    """Attach, list, check, choose for chat and detach servers."""

    def __init__(self, ctx: AppContext, controller: ClusterController) -> None:
        super().__init__()
        self.ctx = ctx
        self.controller = controller
        self._rows: list[RemoteEndpoint] = []
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)

        lay.addWidget(self._attach_card())
        lay.addWidget(self._attached_card())
        lay.addStretch(1)
        self._wire()
        self.refresh()

    # ------------------------------------------------------------ building
    def _attach_card(self) -> Card:
        """Name, URL, key and kind of a server to attach."""
        add = Card()
        add.body.addWidget(label("Attach a server", "sectionTitle"))
        add.body.addWidget(
            muted(
                "Any OpenAI-compatible server: vLLM TP3 on H200s, a SparkInfer bridge, "
                "llama-server on another machine. k3desk checks it answers, then the chat "
                "talks to it whenever no engine runs on this machine."
            )
        )
        form = QFormLayout()
        self.name = QLineEdit()
        self.name.setObjectName("endpointName")
        self.name.setPlaceholderText("e.g. vllm-h200")
        self.url = QLineEdit()
        self.url.setObjectName("endpointUrl")
        self.url.setPlaceholderText("http://10.0.0.21:8008 (with or without /v1)")
        self.key = QLineEdit()
        self.key.setObjectName("endpointKey")
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("optional; kept in the system keyring, never in a file")
        self.key_env = QLineEdit()
        self.key_env.setObjectName("endpointKeyEnv")
        self.key_env.setPlaceholderText("or the name of an environment variable holding it")
        form.addRow("Name", self.name)
        form.addRow("URL", self.url)
        self.server = server_box("endpointServer")
        self.server.setToolTip("What kind of server it is; k3desk finds out when left alone.")
        form.addRow("API key", self.key)
        form.addRow("Key variable", self.key_env)
        form.addRow("Server", self.server)
        add.body.addLayout(form)
        row = QHBoxLayout()
        self.result = label("", selectable=True)
        self.result.setObjectName("attachResult")
        row.addWidget(self.result, 1)
        self.attach_btn = primary(QPushButton("Attach and use for chat"))
        self.attach_btn.setObjectName("attachEndpoint")
        row.addWidget(self.attach_btn)
        add.body.addLayout(row)
        return add

    def _attached_card(self) -> Card:
        """The attached servers, what to do with the selected one, and its kind."""
        have = Card()
        have.body.addWidget(label("Attached servers", "sectionTitle"))
        self.table = QTableWidget(0, len(ENDPOINT_COLUMNS))
        self.table.setObjectName("endpointTable")
        self.table.setHorizontalHeaderLabels(list(ENDPOINT_COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        hh.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.setMinimumHeight(150)
        have.body.addWidget(self.table)
        brow = QHBoxLayout()
        self.chat_state = label("", selectable=True)
        self.chat_state.setObjectName("chatTarget")
        brow.addWidget(self.chat_state, 1)
        self.use_btn = QPushButton("Use for chat")
        self.use_btn.setObjectName("useEndpoint")
        self.unuse_btn = QPushButton("Stop using")
        self.check_btn = QPushButton("Check")
        self.detach_btn = QPushButton("Detach")
        self.detach_btn.setProperty("danger", True)
        for b in (self.check_btn, self.use_btn, self.unuse_btn, self.detach_btn):
            brow.addWidget(b)
        have.body.addLayout(brow)
        krow = QHBoxLayout()
        krow.addWidget(muted("The selected server is"))
        self.kind = server_box("endpointKind")
        self.kind.setToolTip(
            "How k3desk talks to the selected server; leave it to k3desk unless it is wrong."
        )
        krow.addWidget(self.kind)
        self.kind_note = muted("")
        self.kind_note.setObjectName("endpointKindNote")
        self.kind_note.setWordWrap(True)
        krow.addWidget(self.kind_note, 1)
        have.body.addLayout(krow)
        return have

    def _wire(self) -> None:
        self.attach_btn.clicked.connect(self.attach)
        self.use_btn.clicked.connect(lambda: self._with_selected(self.controller.use_endpoint))
        self.unuse_btn.clicked.connect(lambda: self.controller.use_endpoint(""))
        self.check_btn.clicked.connect(lambda: self._with_selected(self._check))
        self.detach_btn.clicked.connect(lambda: self._with_selected(self.controller.detach))
        self.table.itemSelectionChanged.connect(self._buttons)
        self.table.itemSelectionChanged.connect(self._show_kind)
        self.kind.activated.connect(lambda _i: self._set_kind())
        for edit in (self.name, self.url):
            edit.textChanged.connect(lambda _t: self._buttons())
        self.ctx.ops.did_execute.connect(self._changed)
        self.controller.changed.connect(self._chat_state)
        self.ctx.engine.state_changed.connect(lambda _s, _m: self._chat_state())

    # ------------------------------------------------------------- list
    def _changed(self, changes: OpChanges, _initiator: object) -> None:
        if changes.touches(Change.ENDPOINTS):  # attached, checked, detached, chosen for chat
            self.refresh()

    def refresh(self) -> None:
        try:
            rows = self.controller.endpoint_list()
        except K3Error as exc:
            rows = []
            self.result.setText(f"{exc.message} {exc.hint}".strip())
        selected = self.selected()
        self._rows = rows
        self.table.setRowCount(len(rows))
        for i, ep in enumerate(rows):
            using = ep.name == self.controller.active_endpoint
            for j, cell in enumerate(endpoint_cells(ep, using)):
                self.table.setItem(i, j, cell_item(cell))
            if ep.name == selected:
                self.table.selectRow(i)
        if rows and self.selected() is None:
            self.table.selectRow(0)
        self._chat_state()
        self._buttons()
        self._show_kind()

    def selected(self) -> str | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if not rows or not 0 <= rows[0].row() < len(self._rows):
            return None
        return self._rows[rows[0].row()].name

    def _with_selected(self, fn: object) -> None:
        name = self.selected()
        if name is not None and callable(fn):
            fn(name)

    def _endpoint(self, name: str | None) -> RemoteEndpoint | None:
        return next((e for e in self._rows if e.name == name), None)

    def _show_kind(self) -> None:
        """The selected server's kind: who said so, and what differs about it."""
        ep = self._endpoint(self.selected())
        self.kind.blockSignals(True)
        self.kind.setCurrentIndex(
            max(0, self.kind.findData(ep.server if ep is not None and ep.server_set else ""))
        )
        self.kind.blockSignals(False)
        if ep is None or not ep.server:
            self.kind_note.setText("")
            return
        how = "you said so" if ep.server_set else "k3desk found it"
        differs = DIALECTS[ep.server].differs  # type: ignore[index]
        self.kind_note.setText(f"{DIALECTS[ep.server].label} ({how}): {differs}.")  # type: ignore[index]

    def _set_kind(self) -> None:
        name = self.selected()
        if name is None:
            return
        kind = str(self.kind.currentData() or "") or None
        self.result.setText(f"Checking {name}…")
        self.controller.set_server(name, kind, self._checked(name))

    def _buttons(self) -> None:
        sel = self.selected()
        none = "Select an attached server first."
        for b in (self.use_btn, self.check_btn, self.detach_btn):
            set_enabled(b, sel is not None, none)
        set_enabled(self.kind, sel is not None, none)
        set_enabled(
            self.unuse_btn, bool(self.controller.active_endpoint), "No attached server is in use."
        )
        ready = bool(self.name.text().strip()) and bool(self.url.text().strip())
        set_enabled(self.attach_btn, ready, "Give the server a name and its URL.")

    def _chat_state(self) -> None:
        engine = self.ctx.engine
        ep = engine.chat_endpoint()
        if engine.endpoint() is not None:
            text = f"The chat uses the engine on this machine ({ep.root if ep else ''})."
        elif ep is not None:
            text = f"The chat uses {engine.state_text()}."
        else:
            text = "The chat has no server: attach one, or start an engine."
        if self.controller.endpoint_error:
            text += f"  {self.controller.endpoint_error}"
        self.chat_state.setText(text)
        self._buttons()

    # ----------------------------------------------------------- actions
    def attach(self) -> None:
        name, url = self.name.text().strip(), self.url.text().strip()
        key = self.key.text() or None
        key_env = self.key_env.text().strip()
        self.result.setObjectName("muted")
        self.result.setText(f"Contacting {url}…")
        self.attach_btn.setEnabled(False)

        def done(ep: RemoteEndpoint, where: str) -> None:
            what = [f"model {ep.model}"] if ep.model else []
            if ep.n_ctx:
                what.append(f"context {ep.n_ctx:,}")
            if ep.vision is not None:
                what.append("images" if ep.vision else "text only")
            extra = f" ({', '.join(what)})" if what else ""
            kind = f" It is a {ep.server_text()}." if ep.server else ""
            self._show(
                f"Attached {ep.name} at {ep.url}{extra}; {where}.{kind}", ok=not ep.server_problem
            )
            self.key.clear()
            self._buttons()

        def error(exc: BaseException) -> None:
            text = f"{exc.message} {exc.hint}".strip() if isinstance(exc, K3Error) else str(exc)
            self._show(text, ok=False)
            self._buttons()

        server = str(self.server.currentData() or "") or None
        self.controller.attach(
            name, url, api_key=key, key_env=key_env, server=server, on_done=done, on_error=error
        )

    def _check(self, name: str) -> None:
        self.result.setText(f"Checking {name}…")
        self.controller.check_endpoint(name, self._checked(name))

    def _checked(self, name: str) -> Callable[[EndpointStatus], None]:
        def done(st: EndpointStatus) -> None:
            if not st.up:
                self._show(f"{name} is down: {st.error}", ok=False)
                return
            caps = st.capabilities
            assert caps is not None
            model = f", model {caps.model}" if caps.model else ""
            server = caps.server
            limits = server.limits_text()
            text = (
                f"{name} is up at {st.endpoint.url}{model} ({st.latency_s * 1000:.0f} ms): "
                f"{server.describe()}" + (f"; {limits}" if limits else "") + "."
            )
            if server.problem:
                text += f" It cannot chat: {server.problem}."
            self._show(text, ok=not server.problem)

        return done

    def _show(self, text: str, *, ok: bool) -> None:
        self.result.setText(text)
        self.result.setObjectName("okText" if ok else "errorText")
        self.result.style().polish(self.result)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
