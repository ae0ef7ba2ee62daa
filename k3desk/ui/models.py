"""The Models page: your own GGUF sets ("My models", :mod:`k3desk.ui.mymodels`) and every
published tier, each with its verdict for this machine (or a loaded hardware file), saying
which machine it judges, with the way back to this one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QHBoxLayout, QPushButton, QTabWidget, QVBoxLayout, QWidget

from k3desk.core.app.tiers import TierJudgement
from k3desk.ui.hubmodels import HubModels
from k3desk.ui.judged import JudgedBar
from k3desk.ui.mymodels import MyModels
from k3desk.ui.pages import Navigator, Page
from k3desk.ui.tiers import TierTable
from k3desk.ui.widgets import ElidedLabel, PageHeader, keep_rows, label, primary, scroll_body

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext


class ModelsPage(Page):
    def __init__(self, ctx: AppContext, window: Navigator | None = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.nav = window
        self.hardware = ctx.hardware
        lay = scroll_body(self, "modelsScroll")  # a small screen scrolls, nothing is cut
        lay.setContentsMargins(28, 22, 28, 16)
        self.header = PageHeader(
            "Models",
            "Your own Kimi-K3 GGUF files, and the published quantization tiers as their "
            "publishers describe them, judged for a machine by k3desk's planner.",
        )
        lay.addWidget(self.header)
        self.judged_bar = JudgedBar(ctx)
        lay.addWidget(self.judged_bar)
        self.mine = MyModels(ctx, window)
        lay.addWidget(self.mine)
        # what the catalog knows, and what the Hub has now: one tab each
        self.sources = QTabWidget()
        self.sources.setObjectName("modelSources")
        tiers = QWidget()
        tiers_lay = QVBoxLayout(tiers)
        tiers_lay.setContentsMargins(0, 8, 0, 0)
        self.summary = label("Looking at this machine and planning every tier…")
        self.summary.setObjectName("recommendation")
        tiers_lay.addWidget(self.summary)
        self.table = TierTable()
        keep_rows(self.table, 3)
        tiers_lay.addWidget(self.table, 1)
        self.sources.addTab(tiers, "Published tiers")
        self.hub = HubModels(ctx, window)
        self.sources.addTab(self.hub, "On the Hub")
        lay.addWidget(self.sources, 1)
        row = QHBoxLayout()
        # the whole ordering rule in its tooltip: one line, elided, not a paragraph that
        # takes the table's room on a small screen
        self.rule = ElidedLabel("", "tierRule")
        self.rule.setProperty("muted", True)
        row.addWidget(self.rule, 1)
        wizard = primary(QPushButton("Download and run a tier…"))
        wizard.setObjectName("openWizard")
        wizard.clicked.connect(self._wizard)
        row.addWidget(wizard)
        lay.addLayout(row)
        self.hardware.judged.connect(self.show_judgement)
        if self.hardware.judgement is not None:
            self.show_judgement(self.hardware.judgement)
            self.mine.refresh()

    def activated(self) -> None:
        self.hardware.ensure()

    def show_judgement(self, judged: TierJudgement) -> None:
        self.summary.setText(judged.summary)
        self.rule.setText(judged.ordering_rule)
        self.table.set_judgement(judged)
        if self.ctx.settings.tier_id:
            self.table.select_tier(self.ctx.settings.tier_id)

    def _wizard(self) -> None:
        """The wizard, with the tier chosen in the table kept (not the recommended one)."""
        from k3desk.ui.wizard.wizard import TierWizard

        if self.nav is None:
            return
        wizard = self.nav.open_wizard()
        row = self.table.current()
        if isinstance(wizard, TierWizard) and row is not None:
            wizard.wanted_tier = row.tier.id
