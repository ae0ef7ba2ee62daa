"""The wizard's engine step: the llama-server that will run the tier here (found, probed, built
if needed, launched with the plan for this machine), or the engine started on the cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QHBoxLayout, QPushButton, QScrollArea, QVBoxLayout, QWidget

from k3desk.core.app.values import K3Error
from k3desk.ui.cluster.assessment import AssessmentView
from k3desk.ui.widgets import Card, label, muted, primary, set_enabled
from k3desk.ui.wizard.base import StepPage

if TYPE_CHECKING:
    from k3desk.ui.cluster.controller import LaunchChoice
    from k3desk.ui.context import AppContext
    from k3desk.ui.wizard.wizard import TierWizard


class ClusterLaunch(QWidget):
    """The engine step for a cluster: the verdict for the chosen tier, Start, and the
    running engine's ranks, phases and progress (the Engine page's cluster view)."""

    def __init__(self, ctx: AppContext) -> None:
        from k3desk.ui.cluster.engine_view import ClusterEngineView

        super().__init__()
        self.ctx = ctx
        self.controller = ctx.cluster
        self.name = ""
        self.choice: LaunchChoice | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        card = Card()
        head = QHBoxLayout()
        self.title = label("", "sectionTitle")
        head.addWidget(self.title, 1)
        self.start_btn = primary(QPushButton("Start on the cluster"))
        self.start_btn.setObjectName("wizardStartCluster")
        head.addWidget(self.start_btn)
        card.body.addLayout(head)
        self.model_note = muted("")
        self.model_note.setObjectName("clusterModel")
        card.body.addWidget(self.model_note)
        self.verdict = AssessmentView()
        card.body.addWidget(self.verdict)
        lay.addWidget(card)
        self.view = ClusterEngineView(ctx)
        lay.addWidget(self.view)
        lay.addStretch(1)
        self.start_btn.clicked.connect(self.start)
        self.controller.group_changed.connect(self._buttons)

    def prepare(self, name: str, choice: LaunchChoice) -> None:
        self.name, self.choice = name, choice
        tier = self.ctx.services.catalog.get(choice.tier_id)
        try:
            a = self.controller.assess(name, choice)
        except K3Error as exc:
            self.verdict.show_error(f"{exc.message} {exc.hint}".strip())
        else:
            self.verdict.show_assessment(a)
        self.title.setText(f"{tier.publisher} {tier.name} on cluster {name}")
        if choice.engine == "rpc":
            self.model_note.setText(
                f"Model: {choice.model}"
                if choice.model
                else "No first shard of the tier was found in the download folder."
            )
        else:
            self.model_note.setText(
                "Every rank loads its own copy of the model from its node's model folder."
            )
        self._buttons()

    def _buttons(self) -> None:
        ctl = self.controller
        a = self.verdict.assessment
        why = (
            f"{ctl.group_title} runs on {ctl.group_cluster}: stop it first."
            if ctl.group_running or ctl.stopping
            else "Nothing to start."
            if a is None or self.choice is None
            else f"{len(a.refusals)} refusal{'s' if len(a.refusals) != 1 else ''} above."
            if not a.ok
            else ""
        )
        set_enabled(
            self.start_btn, not why, why, "Start every process, watch them, restart them together"
        )

    def start(self) -> None:
        if self.choice is None:
            return
        try:
            self.controller.start(self.name, self.choice)
        except K3Error as exc:
            self.ctx.reporter.report(exc)
            self.prepare(self.name, self.choice)


class EngineStepPage(StepPage):
    def __init__(self, ctx: AppContext, wizard: TierWizard) -> None:
        from k3desk.ui.engine.page import EnginePanel

        super().__init__(
            ctx,
            wizard,
            "Engine",
            "The llama-server that will run Kimi-K3: found, probed, built if needed, "
            "and launched with the plan.",
        )
        self.panel = EnginePanel(ctx, compact=True)
        self.lay.addWidget(self.panel, 1)
        self.cluster = ClusterLaunch(ctx)
        self.cluster_scroll = QScrollArea()
        self.cluster_scroll.setWidgetResizable(True)
        self.cluster_scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        self.cluster_scroll.setWidget(self.cluster)
        self.cluster_scroll.hide()
        self.lay.addWidget(self.cluster_scroll, 1)

    def initializePage(self) -> None:
        wiz = self.wiz
        on_cluster = wiz.cluster_mode
        self.panel.setVisible(not on_cluster)
        self.cluster_scroll.setVisible(on_cluster)
        if on_cluster:
            self.setSubTitle(
                "The engine that will run Kimi-K3 on the cluster: checked against the probe, "
                "then started on every node."
            )
            self.cluster.prepare(wiz.cluster.view.current_name() or "", wiz.cluster_choice())
            return
        row = wiz.selected_tier()
        which = f"{row.tier.publisher} {row.tier.name}" if row is not None else "Kimi-K3"
        self.setSubTitle(
            f"The llama-server that will run {which} here: found, probed, built if needed, "
            "and launched with the plan for this machine."
        )
        self.panel.set_tier(row.tier if row is not None else None)
        target = wiz.where.target()
        self.panel.set_model_folder(target)
        self.panel.refresh_engines()
