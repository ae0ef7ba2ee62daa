"""The Models page: every tier with its verdict for this machine (or a loaded hardware file)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from k3desk.core.planning.recommend import Recommendation
from k3desk.ui.tiers import TierTable
from k3desk.ui.widgets import PageHeader, label, muted, primary

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext


class ModelsPage(QWidget):
    def __init__(self, ctx: AppContext, window: QWidget | None = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.window_ = window
        self.hardware = ctx.controller("hardware")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(28, 22, 28, 16)
        self.header = PageHeader(
            "Models",
            "Kimi-K3 quantization tiers, as their publishers describe them, judged "
            "for this machine by k3desk's planner.",
        )
        lay.addWidget(self.header)
        self.summary = label("Looking at this machine and planning every tier…")
        self.summary.setObjectName("recommendation")
        lay.addWidget(self.summary)
        self.table = TierTable()
        lay.addWidget(self.table, 1)
        row = QHBoxLayout()
        self.rule = muted("")
        row.addWidget(self.rule, 1)
        other = QPushButton("Plan for other hardware…")
        other.clicked.connect(self._other)
        row.addWidget(other)
        wizard = primary(QPushButton("Download and run a tier…"))
        wizard.setObjectName("openWizard")
        wizard.clicked.connect(self._wizard)
        row.addWidget(wizard)
        lay.addLayout(row)
        self.hardware.recommended.connect(self.show_recommendation)
        if self.hardware.recommendation is not None:
            self.show_recommendation(self.hardware.recommendation)

    def activated(self) -> None:
        self.hardware.ensure()

    def show_recommendation(self, rec: Recommendation) -> None:
        src = self.hardware.from_file
        where = f" (hardware file {src})" if src else ""
        self.summary.setText(rec.summary + where)
        self.rule.setText(rec.ordering_rule)
        self.table.set_recommendation(rec)
        if self.ctx.settings.tier_id:
            self.table.select_tier(self.ctx.settings.tier_id)

    def _other(self) -> None:
        f, _ = QFileDialog.getOpenFileName(
            self,
            "Plan for other hardware",
            str(self.ctx.services.resources / "hardware"),
            "Hardware description (*.json);;All files (*)",
        )
        if f:
            self.hardware.load_file(f)

    def _wizard(self) -> None:
        opener = getattr(self.window_, "open_wizard", None)
        if opener is not None:
            opener()
