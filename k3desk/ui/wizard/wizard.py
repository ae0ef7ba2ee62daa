"""The tier-picker wizard: your machine -> [your cluster] -> tiers -> where and how ->
download -> engine.

Every number comes from core (the judged machine and its tier judgement, the
cluster's probe and assessment, the download job, engine probes and the
supervisors); the steps only lay them out.  With "Several machines" chosen on the
first step, the cluster step embeds the Cluster page's editor, probe and verdict,
the tiers step judges every tier for that cluster and engine, and the engine step
starts the engine on the cluster.  Planning for a hardware file changes what the
steps judge, never what the engine step launches here: that always plans for this
machine.

One module per step: :mod:`~k3desk.ui.wizard.machine`, :mod:`~k3desk.ui.wizard.cluster`,
:mod:`~k3desk.ui.wizard.tiers`, :mod:`~k3desk.ui.wizard.where`,
:mod:`~k3desk.ui.wizard.download`, :mod:`~k3desk.ui.wizard.engine`; this one holds the
flow between them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QWidget, QWizard

from k3desk.core.app.cluster_tiers import ClusterTierRow
from k3desk.core.app.models import find_model
from k3desk.core.app.search import SetRow
from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import TierJudgement, TierRow
from k3desk.ui.widgets import fit_screen
from k3desk.ui.wizard.base import Step
from k3desk.ui.wizard.cluster import ClusterStepPage
from k3desk.ui.wizard.download import DownloadPage
from k3desk.ui.wizard.engine import EngineStepPage
from k3desk.ui.wizard.machine import MachinePage
from k3desk.ui.wizard.tiers import TiersPage
from k3desk.ui.wizard.where import WherePage

if TYPE_CHECKING:
    from k3desk.ui.cluster.controller import LaunchChoice
    from k3desk.ui.context import AppContext


class TierWizard(QWizard):
    """Signals:
    have_files(): "I already have the files" (any step): the wizard closed for My models.
    """

    have_files_chosen = Signal()

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.setObjectName("tierWizard")
        self.setWindowTitle("Set up Kimi-K3")
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnStartPage, True)
        self.setOption(QWizard.WizardOption.HaveHelpButton, False)
        self.resize(fit_screen(self, 1100, 760))
        self.hardware = ctx.hardware
        # the tier chosen where the wizard was opened from (the Models page's table): the
        # tiers step selects it instead of the recommended one ("": the recommended)
        self.wanted_tier = ""
        self.machine = MachinePage(ctx, self)
        self.cluster = ClusterStepPage(ctx, self)
        self.tiers = TiersPage(ctx, self)
        self.where = WherePage(ctx, self)
        self.download = DownloadPage(ctx, self)
        self.engine = EngineStepPage(ctx, self)
        pages = (self.machine, self.cluster, self.tiers, self.where, self.download, self.engine)
        for step, page in zip(Step, pages, strict=True):
            self.setPage(int(step), page)
        self.hardware.changed.connect(self._subject)
        self.hardware.judged.connect(self._judged)
        if self.hardware.profile is not None:
            self.machine.show_profile(self.hardware.profile)
        if self.hardware.judgement is not None:
            self._judged(self.hardware.judgement)
        self.hardware.ensure()
        self.accepted.connect(self._done)

    def have_files(self) -> None:
        """Leave the wizard for My models, to add the GGUF files already on disk (reachable
        from every step: a full disk must not stand between someone and their files)."""
        try:
            self.ctx.update_settings(wizard_done=True)  # not opened again on the next start
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.ctx.reporter.report(exc)
        self.reject()
        self.have_files_chosen.emit()

    def current_key(self) -> str:
        cur = self.currentId()
        return Step(cur).key if 0 <= cur < len(Step) else ""

    @property
    def cluster_mode(self) -> bool:
        """ "Several machines" is chosen: the later steps are about the cluster step's cluster."""
        return self.machine.several.isChecked()

    def plan_key(self) -> str:
        """What the tiers are judged for: "machine" or "cluster:<name>:<engine>"."""
        if not self.cluster_mode:
            return "machine"
        view = self.cluster.view
        return f"cluster:{view.current_name()}:{view.choice().engine}"

    def selected_tier(self) -> TierRow | ClusterTierRow | None:
        return self.tiers.table.current()

    def hub_set(self) -> SetRow | None:
        """The set of the Hub chosen on the tiers step instead of a catalog tier (one
        machine only): the where and download steps fetch exactly it."""
        return None if self.cluster_mode else self.tiers.chosen_hub

    def cluster_choice(self) -> LaunchChoice:
        """The cluster step's engine choice for the tier picked on the tiers step; for
        llama.cpp RPC the model is the first shard in the download folder unless one was
        chosen on the cluster step."""
        choice = self.cluster.view.choice()
        row = self.selected_tier()
        if row is not None:
            choice = replace(choice, tier_id=row.tier.id)
        if choice.engine == "rpc" and not choice.model:
            found = find_model(self.where.target())
            if found is not None:
                choice = replace(choice, model=str(found.shard))
        return choice

    def _subject(self, _subject: Subject) -> None:
        if self.hardware.profile is not None:
            self.machine.show_profile(self.hardware.profile)

    def _judged(self, judged: TierJudgement) -> None:
        self.machine.show_judgement(judged)
        if not self.cluster_mode:
            self.tiers.show_judgement(judged)
        elif self.currentId() == Step.TIERS:
            self.tiers.show_cluster()
        else:
            self.tiers.shown = ""  # judged again when the tiers step is shown

    def _done(self) -> None:
        row = self.selected_tier()
        changes: dict[str, Any] = {"wizard_done": True}
        if row is not None:
            changes["tier_id"] = row.tier.id
        hub = self.hub_set()
        if hub is not None and hub.tier is not None:
            changes["tier_id"] = hub.tier.id
        try:
            self.ctx.update_settings(**changes)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.ctx.reporter.report(exc)
