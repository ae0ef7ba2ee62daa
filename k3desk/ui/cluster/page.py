"""The Cluster page: clusters of machines reached over SSH, their probe, the engine choice
with the core's verdict, and attached servers.

Everything shown comes from core: the probe reports (GPUs, memory, free disk, the
tier's copy on each node), the cross-node plan, SparkInfer's and RPC's refusals
and warnings (verbatim), and the explanation of the model card's SparkInfer
command.  Probes and starts run through the task manager and the cluster
controller; the page only lays the answers out.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QSpinBox,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.clusters import (
    BRIDGE_PORT,
    CARD_COMMAND,
    CHAT_TEMPLATE_NAME,
    COORD_PORT,
    DEFAULT_PROFILE,
    PROFILES,
    SERVE_PORT,
    SPARKINFER_TIER,
    Assessment,
    Cluster,
    SparkInferConfig,
    describe_launch,
    explain_card_command,
)
from k3desk.core.app.operations import Change, OpChanges
from k3desk.core.app.presenters.cluster_nodes import NODE_COLUMNS, node_cells
from k3desk.core.app.values import K3Error, Progress
from k3desk.ui.cells import cell_item
from k3desk.ui.cluster.assessment import AssessmentView, fit_height, fixed_table
from k3desk.ui.cluster.controller import ClusterController, LaunchChoice
from k3desk.ui.cluster.editor import ClusterEditor
from k3desk.ui.cluster.endpoints import EndpointsPanel
from k3desk.ui.pages import Navigator, Page, PageKey
from k3desk.ui.widgets import Card, PageHeader, dialog_folder, label, muted, primary, set_enabled

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext


class ClusterPage(Page):
    """Clusters (list, editor, probe, engine choice, verdict, start) and attached servers.

    ``embedded``: the clusters part only (no header, no attached servers, no Start
    button), for the set-up wizard's cluster step, which starts the engine itself.

    Signals:
        changed(): the cluster shown, the engine choice or the verdict changed.
    """

    changed = Signal()

    def __init__(
        self, ctx: AppContext, window: Navigator | None = None, *, embedded: bool = False
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.nav = window
        self.embedded = embedded
        self.controller: ClusterController = ctx.cluster
        self.assessment: Assessment | None = None
        outer = QVBoxLayout(self)
        if embedded:
            outer.setContentsMargins(0, 0, 0, 0)
        else:
            outer.setContentsMargins(28, 22, 28, 16)
            outer.addWidget(
                PageHeader(
                    "Cluster",
                    "Run Kimi-K3 across several machines reached over SSH (keys only), with "
                    "SparkInfer on DGX Sparks or llama.cpp RPC workers, or chat with a server "
                    "that already runs it.",
                )
            )
        self.tabs: QTabWidget | None = None
        if not embedded:
            self.tabs = QTabWidget()
            self.tabs.setObjectName("clusterTabs")

        ctab = QWidget()
        clay = QHBoxLayout(ctab)
        clay.setContentsMargins(0, 0 if embedded else 10, 0, 0)
        clay.addLayout(self._cluster_list())
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        body = QWidget()
        self.body = QVBoxLayout(body)
        self.body.setContentsMargins(6, 0, 4, 0)
        scroll.setWidget(body)
        clay.addWidget(scroll, 1)
        self.empty = muted(
            "No cluster yet. Add one: a name and its nodes (host, SSH user, port, key, and "
            "the folder that holds the model on each node)."
        )
        self.empty.setObjectName("clusterEmpty")
        self.body.addWidget(self.empty)

        self.body.addWidget(self._nodes_card())
        self.body.addWidget(self._engine_card())
        self.body.addWidget(self._card_command_card())
        self.body.addStretch(1)
        if self.tabs is None:
            self.start_btn.hide()
            outer.addWidget(ctab, 1)
        else:
            self.tabs.addTab(ctab, "Clusters")
            # -------------------------------------------------- servers tab
            self.servers = EndpointsPanel(self.ctx, self.controller)
            self.tabs.addTab(self.servers, "Attached servers")
            outer.addWidget(self.tabs, 1)

        self._wire()
        self._explain()
        self.reload()

    # ------------------------------------------------------------ building
    def _cluster_list(self) -> QVBoxLayout:
        """The clusters, and Add / Edit / Remove."""
        left = QVBoxLayout()
        left.addWidget(label("Clusters", "sectionTitle"))
        self.list = QListWidget()
        self.list.setObjectName("clusterList")
        self.list.setFixedWidth(140)  # the engine card needs the rest at 1280 px
        left.addWidget(self.list, 1)
        self.load_error = label("", "errorText", selectable=True)
        self.load_error.hide()
        left.addWidget(self.load_error)
        lrow = QGridLayout()
        self.add_btn = primary(QPushButton("Add…"))
        self.add_btn.setObjectName("addCluster")
        self.edit_btn = QPushButton("Edit…")
        self.edit_btn.setObjectName("editCluster")
        self.remove_btn = QPushButton("Remove")
        self.remove_btn.setObjectName("removeCluster")
        lrow.addWidget(self.add_btn, 0, 0)
        lrow.addWidget(self.edit_btn, 0, 1)
        lrow.addWidget(self.remove_btn, 1, 0, 1, 2)
        left.addLayout(lrow)
        return left

    def _nodes_card(self) -> Card:
        """The nodes and their probe, for the tier whose copies are checked."""
        self.nodes_card = Card()
        nb = self.nodes_card.body
        head = QHBoxLayout()
        self.title = label("", "sectionTitle")
        head.addWidget(self.title, 1)
        head.addWidget(muted("Check copies of"))
        self.tier = QComboBox()
        self.tier.setObjectName("clusterTier")
        for t in self.ctx.services.catalog.tiers:
            self.tier.addItem(f"{t.publisher} {t.name} ({t.shard_count} shards)", t.id)
        self.tier.setCurrentIndex(max(0, self.tier.findData(SPARKINFER_TIER)))
        head.addWidget(self.tier)
        self.probe_btn = primary(QPushButton("Probe"))
        self.probe_btn.setObjectName("probeCluster")
        head.addWidget(self.probe_btn)
        nb.addLayout(head)
        self.nodes = fixed_table(NODE_COLUMNS, "nodeTable", stretch=5)
        nb.addWidget(self.nodes)
        self.probe_bar = QProgressBar()
        self.probe_bar.setObjectName("probeProgress")
        self.probe_bar.hide()
        nb.addWidget(self.probe_bar)
        self.probe_note = label("", selectable=True)
        self.probe_note.setObjectName("probeNote")
        nb.addWidget(self.probe_note)
        return self.nodes_card

    def _engine_card(self) -> Card:
        """The engine choice, its options, the verdict and the commands it runs."""
        self.engine_card = Card()
        eb = self.engine_card.body
        ehead = QHBoxLayout()
        ehead.addWidget(label("Engine", "sectionTitle"), 1)
        self.start_btn = primary(QPushButton("Start on the cluster"))
        self.start_btn.setObjectName("startCluster")
        ehead.addWidget(self.start_btn)
        eb.addLayout(ehead)
        erow = QHBoxLayout()
        self.spark_radio = QRadioButton("SparkInfer (TP3 / TP4 on DGX Spark)")
        self.spark_radio.setObjectName("engineSparkInfer")
        self.rpc_radio = QRadioButton("llama.cpp RPC (workers on the nodes, llama-server here)")
        self.rpc_radio.setObjectName("engineRpc")
        self.spark_radio.setChecked(True)
        group = QButtonGroup(self)
        group.addButton(self.spark_radio)
        group.addButton(self.rpc_radio)
        erow.addWidget(self.spark_radio)
        erow.addWidget(self.rpc_radio)
        erow.addStretch(1)
        eb.addLayout(erow)

        eb.addLayout(self._engine_options())
        self.verdict_view = AssessmentView()
        eb.addWidget(self.verdict_view)
        self.verdict = self.verdict_view.verdict
        self.plan = self.verdict_view.plan
        self.refusals = self.verdict_view.refusals
        self.warnings = self.verdict_view.warnings
        self.notes = self.verdict_view.notes
        srow = QHBoxLayout()
        self.commands_btn = QToolButton()
        self.commands_btn.setText("Commands k3desk will run")
        self.commands_btn.setCheckable(True)
        self.commands_btn.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.commands_btn.setArrowType(Qt.ArrowType.RightArrow)
        srow.addWidget(self.commands_btn)
        srow.addStretch(1)
        eb.addLayout(srow)
        self.commands = QPlainTextEdit()
        self.commands.setObjectName("clusterCommands")
        self.commands.setReadOnly(True)
        self.commands.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.commands.setMaximumHeight(130)
        self.commands.hide()
        eb.addWidget(self.commands)
        return self.engine_card

    def _engine_options(self) -> QHBoxLayout:
        """The context, then SparkInfer's options and ports or RPC's model and port."""
        opts = QHBoxLayout()
        form = QFormLayout()
        self.ctx_size = QSpinBox()
        self.ctx_size.setRange(512, 1_048_576)
        self.ctx_size.setSingleStep(1024)
        self.ctx_size.setValue(self.ctx.settings.ctx)
        form.addRow("Context", self.ctx_size)
        opts.addLayout(form)
        opts.addWidget(self._spark_options())
        opts.addWidget(self._spark_ports())
        opts.addWidget(self._rpc_options(), 1)
        opts.addStretch(0)
        return opts

    def _spark_options(self) -> QWidget:
        """SparkInfer's profile, drafts, and the bridge's tokenizer and chat template."""
        self.spark_opts = QWidget()
        sform = QFormLayout(self.spark_opts)
        sform.setContentsMargins(0, 0, 0, 0)
        self.profile = QComboBox()
        self.profile.setObjectName("recipeProfile")
        for p in PROFILES.values():
            self.profile.addItem(p.title, p.name)
            self.profile.setItemData(
                self.profile.count() - 1, f"{p.note} ({p.source})", Qt.ItemDataRole.ToolTipRole
            )
        self.profile.setCurrentIndex(self.profile.findData(DEFAULT_PROFILE))
        self.profile.setToolTip(
            "The recipe's own launch profiles: environment (expert skipping and CUDA graphs "
            "off, exact arithmetic) and drafter flags on every rank"
        )
        sform.addRow("Profile", self.profile)
        self.spec_draft = QSpinBox()
        self.spec_draft.setRange(0, 16)
        self.spec_draft.setSpecialValueText("the profile's")
        self.spec_draft.setToolTip(
            "--spec-draft K (2-16) on every rank instead of the profile's; the baseline "
            "profile drafts nothing"
        )
        sform.addRow("Speculative drafts", self.spec_draft)
        self.tokenizer_dir = QLineEdit()
        self.tokenizer_dir.setObjectName("tokenizerDir")
        self.tokenizer_dir.setToolTip(
            "The model's tokenizer folder on rank 0, for the HTTP bridge (K3_TOKENIZER_DIR); "
            "empty = tokenizer/ beside the model folder, where the recipe fetches it from "
            "moonshotai/Kimi-K3 (the model card's download does not bring it)"
        )
        sform.addRow("Tokenizer folder", self.tokenizer_dir)
        self.chat_template = QLineEdit()
        self.chat_template.setObjectName("chatTemplate")
        self.chat_template.setToolTip(
            "The chat template on rank 0, for the HTTP bridge (K3_CHAT_TEMPLATE); "
            f"empty = {CHAT_TEMPLATE_NAME} in the model folder, downloaded with the shards"
        )
        sform.addRow("Chat template", self.chat_template)
        return self.spark_opts

    def _spark_ports(self) -> QWidget:
        """SparkInfer's coordinator, serve socket and HTTP bridge ports."""
        self.ports = QWidget()
        pform = QFormLayout(self.ports)
        pform.setContentsMargins(0, 0, 0, 0)
        self.coord_port = self._port(COORD_PORT, "coordinatorPort")
        self.serve_port = self._port(SERVE_PORT, "servePort")
        self.bridge_port = self._port(BRIDGE_PORT, "bridgePort")
        pform.addRow("Coordinator port", self.coord_port)
        pform.addRow("Serve socket port", self.serve_port)
        pform.addRow("HTTP bridge port", self.bridge_port)
        return self.ports

    def _rpc_options(self) -> QWidget:
        """RPC: the model on this machine, the workers' port, public addresses."""
        self.rpc_opts = QWidget()
        rform = QFormLayout(self.rpc_opts)
        rform.setContentsMargins(0, 0, 0, 0)
        mrow = QHBoxLayout()
        self.model = QLineEdit()
        self.model.setObjectName("rpcModel")
        self.model.setPlaceholderText("first shard on this machine: …-00001-of-000NN.gguf")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse_model)
        mrow.addWidget(self.model, 1)
        mrow.addWidget(browse)
        rform.addRow("Model", mrow)
        self.rpc_port = self._port(50052, "rpcPort")
        rform.addRow("Worker port", self.rpc_port)
        self.allow_public = QCheckBox(
            "Let workers listen on public or wildcard addresses (RPC has no authentication)"
        )
        self.allow_public.setObjectName("allowPublic")
        rform.addRow("", self.allow_public)
        return self.rpc_opts

    def _card_command_card(self) -> Card:
        """The model card's SparkInfer command, explained."""
        self.card_card = Card()
        kb = self.card_card.body
        self.card_toggle = QToolButton()
        self.card_toggle.setObjectName("cardToggle")
        self.card_toggle.setText("Copied the SparkInfer command from the model card?")
        self.card_toggle.setCheckable(True)
        self.card_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.card_toggle.setArrowType(Qt.ArrowType.RightArrow)
        kb.addWidget(self.card_toggle)
        self.card_box = QWidget()
        cl = QVBoxLayout(self.card_box)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addWidget(muted("Paste the command you copied; k3desk says what does not exist."))
        self.card_input = QPlainTextEdit(CARD_COMMAND)
        self.card_input.setObjectName("cardCommand")
        self.card_input.setMaximumHeight(70)
        cl.addWidget(self.card_input)
        self.card_explain = QPlainTextEdit()
        self.card_explain.setObjectName("cardExplanation")
        self.card_explain.setReadOnly(True)
        self.card_explain.setMinimumHeight(360)
        cl.addWidget(self.card_explain)
        self.card_box.hide()
        kb.addWidget(self.card_box)
        return self.card_card

    def _wire(self) -> None:
        """Every control refreshes the verdict; the controller's news reach the page."""
        self.list.currentRowChanged.connect(lambda _r: self.refresh())
        self.add_btn.clicked.connect(self.add_cluster)
        self.edit_btn.clicked.connect(self.edit_cluster)
        self.remove_btn.clicked.connect(self.remove_cluster)
        self.probe_btn.clicked.connect(self.probe)
        self.tier.currentIndexChanged.connect(lambda _i: self.refresh())
        for w in (self.spark_radio, self.rpc_radio):
            w.toggled.connect(lambda _on: self.refresh())
        for spin in (
            self.ctx_size,
            self.spec_draft,
            self.coord_port,
            self.serve_port,
            self.bridge_port,
            self.rpc_port,
        ):
            spin.valueChanged.connect(lambda _v: self.refresh())
        self.profile.currentIndexChanged.connect(lambda _i: self.refresh())
        self.model.textChanged.connect(lambda _t: self.refresh())
        for edit in (self.tokenizer_dir, self.chat_template):
            edit.textChanged.connect(lambda _t: self.refresh())
        self.allow_public.toggled.connect(lambda _on: self.refresh())
        self.commands_btn.toggled.connect(self._toggle_commands)
        self.card_toggle.toggled.connect(self._toggle_card)
        self.card_input.textChanged.connect(self._explain)
        self.start_btn.clicked.connect(self.start)
        self.ctx.ops.did_execute.connect(self._changed)
        self.controller.probe_progress.connect(self._probe_progress)
        self.controller.probe_finished.connect(self._probe_finished)  # dropped with the page
        self.controller.group_changed.connect(self._buttons)

    def _changed(self, changes: OpChanges, _initiator: object) -> None:
        if changes.touches(Change.CLUSTERS):  # added, edited, removed (here or in the wizard)
            self.reload()

    def _port(self, value: int, name: str) -> QSpinBox:
        spin = QSpinBox()
        spin.setObjectName(name)
        spin.setRange(1, 65535)
        spin.setValue(value)
        return spin

    def activated(self) -> None:
        self.refresh()

    def show_servers(self) -> None:
        """Show the Attached servers tab (the page's own; an embedded page has none)."""
        if self.tabs is not None:
            self.tabs.setCurrentWidget(self.servers)

    # ------------------------------------------------------------ clusters
    def reload(self, select: str | None = None) -> None:
        current = select or self.current_name()
        clusters = self.controller.clusters()
        self.load_error.setText(self.controller.load_error)
        self.load_error.setVisible(bool(self.controller.load_error))
        self.list.blockSignals(True)
        self.list.clear()
        for c in clusters:
            item = QListWidgetItem(
                f"{c.name}\n{len(c.nodes)} node{'s' if len(c.nodes) != 1 else ''}"
            )
            item.setData(Qt.ItemDataRole.UserRole, c.name)
            item.setToolTip(", ".join(n.label for n in c.nodes))
            self.list.addItem(item)
        self.list.blockSignals(False)
        names = [c.name for c in clusters]
        if names:
            self.list.setCurrentRow(names.index(current) if current in names else 0)
        self.refresh()

    def current_name(self) -> str | None:
        item = self.list.currentItem()
        return str(item.data(Qt.ItemDataRole.UserRole)) if item is not None else None

    def current(self) -> Cluster | None:
        name = self.current_name()
        if name is None:
            return None
        try:
            return self.controller.cluster(name)
        except K3Error:
            return None

    def add_cluster(self) -> ClusterEditor:
        return self._edit(None)

    def edit_cluster(self) -> ClusterEditor | None:
        cluster = self.current()
        return self._edit(cluster) if cluster is not None else None

    def _edit(self, cluster: Cluster | None) -> ClusterEditor:
        dlg = ClusterEditor(self.controller, cluster, self)

        def done(result: int) -> None:
            if result and dlg.saved is not None:
                self.reload(select=dlg.saved.name)
            dlg.deleteLater()

        dlg.finished.connect(done)
        dlg.open()
        return dlg

    def remove_cluster(self) -> None:
        name = self.current_name()
        if name is None:
            return
        try:
            self.controller.remove_cluster(name)
        except K3Error as exc:
            self.ctx.reporter.report(exc)

    # ---------------------------------------------------------------- probe
    def probe(self) -> None:
        name = self.current_name()
        if name is None:
            return
        self.probe_bar.setRange(0, 0)
        self.probe_bar.setFormat("Connecting to the nodes…")
        self.probe_bar.show()
        self.controller.probe(name, self.tier_id(), self.choice())
        self._buttons()

    def _probe_progress(self, name: str, p: Progress) -> None:
        if name != self.current_name():
            return
        self.probe_bar.show()
        self.probe_bar.setRange(0, max(1, p.total))
        self.probe_bar.setValue(p.done)
        self.probe_bar.setFormat(f"{p.done}/{p.total} · {p.detail}" if p.detail else p.stage)

    # ----------------------------------------------------------------- view
    def tier_id(self) -> str:
        return str(self.tier.currentData() or "")

    def choice(self) -> LaunchChoice:
        k = self.spec_draft.value()
        return LaunchChoice(
            engine="sparkinfer" if self.spark_radio.isChecked() else "rpc",
            tier_id=self.tier_id(),
            ctx=self.ctx_size.value(),
            profile=str(self.profile.currentData() or ""),  # none chosen: an error, not a default
            spec_draft=k or None,
            coord_port=self.coord_port.value(),
            serve_port=self.serve_port.value(),
            bridge_port=self.bridge_port.value(),
            model=self.model.text().strip(),
            rpc_port=self.rpc_port.value(),
            allow_public=self.allow_public.isChecked(),
            tokenizer_dir=self.tokenizer_dir.text().strip(),
            chat_template=self.chat_template.text().strip(),
        )

    def refresh(self) -> None:
        cluster = self.current()
        has = cluster is not None
        self.empty.setVisible(not has)
        for card in (self.nodes_card, self.engine_card):
            card.setVisible(has)
        spark = self.spark_radio.isChecked()
        self.spark_opts.setVisible(spark)
        self.ports.setVisible(spark)
        self.rpc_opts.setVisible(not spark)
        self.card_card.setVisible((spark or not has) and not self.embedded)
        if cluster is None:
            self.assessment = None
            self._buttons()
            self.changed.emit()
            return
        self.title.setText(
            f"{cluster.name} · {len(cluster.nodes)} node{'s' if len(cluster.nodes) != 1 else ''}"
        )
        self._fill_nodes(cluster)
        try:
            self.assessment = self.controller.assess(cluster.name, self.choice())
        except K3Error as exc:
            self.assessment = None
            self.verdict_view.show_error(f"{exc.message} {exc.hint}".strip())
        else:
            self.verdict_view.show_assessment(self.assessment)
        try:
            cfg = self.controller.sparkinfer_config(cluster, self.choice()) if spark else None
        except K3Error as exc:  # no such profile: said, like the verdict above
            cfg = None
            self.commands.setPlainText(f"{exc.message} {exc.hint}".strip())
        if cfg is not None:
            default = SparkInferConfig(cluster)
            unknown = "on rank 0 (its model folder is not set)"
            self.tokenizer_dir.setPlaceholderText(default.tokenizer_path or unknown)
            self.chat_template.setPlaceholderText(default.chat_template_path or unknown)
            self.commands.setPlainText(
                "\n".join(f"{node}: {cmd}" for node, cmd in describe_launch(cfg))
            )
        elif not spark:
            self.commands.setPlainText(
                "An rpc-server on every node, bound to the node's address, then llama-server "
                "--rpc with the workers' addresses on this machine."
            )
        self._buttons()
        self.changed.emit()

    def _fill_nodes(self, cluster: Cluster) -> None:
        name = cluster.name
        reports = {r.node: r for r in self.controller.reports(name, self.tier_id())}
        run = self.controller.probes.get(name)
        stale = run is not None and run.tier_id != self.tier_id()
        self.nodes.setRowCount(len(cluster.nodes))
        for i, node in enumerate(cluster.nodes):
            for j, cell in enumerate(node_cells(node, reports.get(node), stale)):
                self.nodes.setItem(i, j, cell_item(cell))
        fit_height(self.nodes)
        probing = self.controller.probing(name)
        self.probe_bar.setVisible(probing)
        err = self.controller.probe_errors.get(name, "")
        if err:
            self.probe_note.setText(f"The probe failed: {err}")
        elif run is not None:
            reached = sum(1 for r in run.reports if r.ok)
            when = run.finished_at
            self.probe_note.setText(
                f"Probed {reached} of {len(run.reports)} nodes at "
                f"{time.strftime('%H:%M:%S', time.localtime(when))}"
                + (f" for {run.tier_id}." if run.tier_id else ".")
            )
        else:
            self.probe_note.setText(
                "Not probed yet: Probe logs in to every node and reads its GPUs, memory, free "
                "disk and the tier's files (GGUF headers)."
            )

    def _buttons(self) -> None:
        name = self.current_name()
        has = name is not None
        set_enabled(self.edit_btn, has, "Add a cluster first.")
        set_enabled(self.remove_btn, has, "Add a cluster first.")
        probing = has and self.controller.probing(name or "")
        set_enabled(
            self.probe_btn,
            has and not probing,
            "The probe is running." if has else "Add a cluster first.",
            "Log in to every node and read its hardware and model files",
        )
        a = self.assessment
        ctl = self.controller
        why = (
            "Add a cluster first."
            if not has
            else f"{ctl.group_title} runs on {ctl.group_cluster}: stop it on the Engine page."
            if ctl.group_running or ctl.stopping
            else "Nothing to start."
            if a is None
            else f"{len(a.refusals)} refusal{'s' if len(a.refusals) != 1 else ''} above."
            if not a.ok
            else ""
        )
        set_enabled(
            self.start_btn, not why, why, "Start every process, watch them, restart them together"
        )

    # ---------------------------------------------------------------- start
    def start(self) -> None:
        name = self.current_name()
        if name is None:
            return
        try:
            self.controller.start(name, self.choice())
        except K3Error as exc:
            self.ctx.reporter.report(exc)
            self.refresh()
            return
        if self.nav is not None:
            self.nav.show_page(PageKey.ENGINE)
        self._buttons()

    # ----------------------------------------------------------------- misc
    def _browse_model(self) -> None:
        start = dialog_folder(self.ctx, "model", self.model.text())
        f, _ = QFileDialog.getOpenFileName(self, "First shard", start, "GGUF (*.gguf)")
        if f:
            self.model.setText(f)

    def _probe_finished(self, _name: str) -> None:
        self.refresh()

    def _toggle_commands(self, on: bool) -> None:
        self.commands_btn.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.commands.setVisible(on)

    def _toggle_card(self, on: bool) -> None:
        self.card_toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.card_box.setVisible(on)

    def _explain(self) -> None:
        text = self.card_input.toPlainText().strip()
        self.card_explain.setPlainText(explain_card_command(text or CARD_COMMAND))
