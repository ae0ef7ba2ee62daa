"""The line every judging page shows: which machine its numbers are for, the way back to
this machine, and the way to plan for another one (a hardware file)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QPushButton, QWidget

from k3desk.ui.widgets import muted

if TYPE_CHECKING:
    from k3desk.core.app.subject import Subject
    from k3desk.ui.context import AppContext

HW_FILTER = "Hardware description (*.json);;All files (*)"


def choose_hardware_file(ctx: AppContext, parent: QWidget) -> None:
    """Ask for a hardware file (``k3desk doctor --json`` output) and judge the tiers for it."""
    f, _ = QFileDialog.getOpenFileName(
        parent, "Plan for other hardware", str(ctx.services.resources / "hardware"), HW_FILTER
    )
    if f:
        ctx.hardware.load_file(f)


class JudgedBar(QWidget):
    """'Judged for the machine in 8xH100-2TB.json (...)' with "Back to this machine" (shown
    only while another machine is judged) and "Plan for other hardware…"."""

    def __init__(self, ctx: AppContext, prefix: str = "Judged for", *, other: bool = True) -> None:
        super().__init__()
        self.ctx = ctx
        self.prefix = prefix
        self.hardware = ctx.hardware
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.text = muted("")
        self.text.setObjectName("judgedMachine")
        lay.addWidget(self.text, 1)
        self.back = QPushButton("Back to this machine")
        self.back.setObjectName("backToThisMachine")
        self.back.setToolTip("Judge the tiers for the machine k3desk runs on")
        lay.addWidget(self.back)
        self.other = QPushButton("Plan for other hardware…")
        self.other.setObjectName("otherHardware")
        self.other.setToolTip(
            "Load a hardware file (k3desk doctor --json) to see what would fit there; "
            "launches here still plan for this machine"
        )
        self.offer_other = other
        lay.addWidget(self.other)
        self.back.clicked.connect(self._back)
        self.other.clicked.connect(self._other)
        self.cluster: Subject | None = None  # a cluster judged instead of one machine
        # bound methods: Qt drops the connection with this widget
        self.hardware.changed.connect(self._changed)
        self.refresh()

    def _back(self) -> None:
        self.hardware.detect()

    def _other(self) -> None:
        choose_hardware_file(self.ctx, self)

    def _changed(self, _subject: object) -> None:
        self.refresh()

    def show_cluster(self, subject: Subject | None) -> None:
        """Say the page judges ``subject`` (a cluster), or one machine again (None)."""
        self.cluster = subject
        self.refresh()

    def refresh(self) -> None:
        hw = self.hardware
        if self.cluster is not None:
            self.text.setText(f"{self.prefix} {self.cluster.describe()}.")
        elif hw.subject is None:
            self.text.setText("Looking at this machine…")
        else:
            self.text.setText(f"{self.prefix} {hw.describe()}.")
        one = self.cluster is None
        self.back.setVisible(one and not hw.judging_here)
        self.other.setVisible(one and self.offer_other)
