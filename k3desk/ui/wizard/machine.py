"""The wizard's first step: the machine judged, what each tier needs of it (the fit chart),
and the choice between one machine and several."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QButtonGroup,
    QHBoxLayout,
    QPushButton,
    QRadioButton,
    QScrollArea,
)

from k3desk.core.app import actions
from k3desk.core.app.hardware import CpuProbe, HardwareProfile, cpu_check_summary, fmt_read_rate
from k3desk.core.app.tiers import TierJudgement
from k3desk.core.app.values import fmt_bytes
from k3desk.ui.errors import describe
from k3desk.ui.judged import JudgedBar
from k3desk.ui.widgets import Card, label, muted
from k3desk.ui.wizard.base import Step, StepPage
from k3desk.ui.wizard.fitchart import FitChart

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext
    from k3desk.ui.wizard.wizard import TierWizard


def machine_html(hw: HardwareProfile, cpu_speed: str = "") -> str:
    """The machine summary as rich text (RAM, each GPU, CPU features and, with
    ``cpu_speed``, what its kernel check found, free disk)."""
    rows = []
    mem = hw.memory
    limit = " (container limit)" if mem.cgroup_limit and mem.cgroup_limit < mem.total else ""
    rows.append(
        ("Memory", f"{fmt_bytes(mem.usable_total)} RAM{limit}, {fmt_bytes(mem.available)} free")
    )
    if hw.gpus:
        for g in hw.gpus:
            vram = "unified with RAM" if g.unified_memory else f"{fmt_bytes(g.vram_total)} VRAM"
            rows.append((f"GPU {g.index}", f"{g.name} · {vram} · {g.architecture} (sm_{g.sm})"))
    else:
        rows.append(("GPU", hw.gpu_note or "no NVIDIA GPU found"))
    cpu = hw.cpu
    feats = [f for f in ("avx2", "avx512f", "amx_tile", "sve") if f in cpu.flags]
    feat_text = ", ".join(f.replace("_tile", "").upper() for f in feats) or "none of AVX2/AVX-512"
    rows.append(("CPU", f"{cpu.model} · {cpu.usable_cores} cores usable · {feat_text}"))
    if cpu_speed:
        rows.append(("CPU speed", html.escape(cpu_speed)))
    if hw.disk is not None:
        rows.append(
            (
                "Disk",
                f"{fmt_bytes(hw.disk.free)} free of {fmt_bytes(hw.disk.total)} at "
                f"{hw.disk.path} ({hw.disk.filesystem or 'unknown filesystem'})",
            )
        )
        rows.append(("Disk reads", html.escape(fmt_read_rate(hw.disk.read_rate))))
    body = "".join(
        f"<tr><td style='padding:2px 14px 2px 0;'><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows
    )
    return f"<table>{body}</table>"


class MachinePage(StepPage):
    def __init__(self, ctx: AppContext, wizard: TierWizard) -> None:
        super().__init__(
            ctx,
            wizard,
            "Your machine",
            "What k3desk found, and what each Kimi-K3 tier would need of it.",
        )
        self.summary = label("Looking at this machine…")
        self.summary.setObjectName("machineSummary")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        card = Card()
        card.body.addWidget(self.summary)
        self.judged_bar = JudgedBar(ctx, "Planning for")
        card.body.addWidget(self.judged_bar)
        run = QHBoxLayout()
        run.addWidget(label("Run Kimi-K3 on", "sectionTitle", wrap=False))
        self.one = QRadioButton("One machine")
        self.one.setObjectName("oneMachine")
        self.one.setToolTip("This machine, or the one the hardware file describes")
        self.several = QRadioButton("Several machines over SSH (SparkInfer or llama.cpp RPC)")
        self.several.setObjectName("useCluster")
        self.several.setToolTip(
            "Next: pick or add a cluster, probe it and choose its engine; the tiers are then "
            "judged for the cluster"
        )
        self.one.setChecked(True)
        choice = QButtonGroup(self)
        choice.addButton(self.one)
        choice.addButton(self.several)
        run.addSpacing(12)
        run.addWidget(self.one)
        run.addWidget(self.several)
        run.addStretch(1)
        self.have = QPushButton("I already have the files…")
        self.have.setObjectName("machineHaveFiles")
        self.have.setToolTip(
            "Skip the download: add the Kimi-K3 GGUF files you have to My models, see their "
            "verdict for this machine and chat with them"
        )
        self.have.clicked.connect(wizard.have_files)
        card.body.addLayout(run)
        self.check_cpu = QPushButton("Time this CPU")
        self.check_cpu.setObjectName("checkCpu")
        self.check_cpu.setToolTip(
            "Run the engine's own kernels here for about three minutes, so that every speed is "
            "predicted with this CPU's speed rather than that of the machine the shipped "
            "costs were measured on"
        )
        self.check_cpu.clicked.connect(self.time_cpu)
        self.check_note = muted("")
        self.check_note.setObjectName("checkCpuNote")
        have = QHBoxLayout()  # its own row: beside the choice it widens the wizard past 800 px
        have.addWidget(self.check_cpu)
        have.addWidget(self.check_note, 1)
        have.addStretch(1)
        have.addWidget(self.have)
        card.body.addLayout(have)
        self.lay.addWidget(card)
        self.chart = FitChart()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(self.chart)
        self.lay.addWidget(scroll, 1)
        self.chart_scroll = scroll
        # the chart's height (and so the scroll range) settles after it is filled
        scroll.verticalScrollBar().rangeChanged.connect(lambda _lo, _hi: self.show_pick())

    def show_profile(self, hw: HardwareProfile) -> None:
        speed = cpu_check_summary(self.ctx.services, hw)
        self.summary.setText(machine_html(hw, speed))
        self.check_cpu.setVisible(hw.source == "detected")
        self.check_cpu.setText(
            "Time this CPU again" if speed.startswith("timed") else "Time this CPU"
        )

    def time_cpu(self) -> None:
        """Time this CPU's kernels (about three minutes), then judge the tiers again with it."""
        self.check_cpu.setEnabled(False)
        self.check_note.setText("Timing the engine's kernels on this CPU, about three minutes…")

        def done(_probe: CpuProbe) -> None:
            hw = self.wiz.hardware.profile
            if hw is not None:
                self.show_profile(hw)
            self.check_note.setText("Speeds are now predicted with this CPU's own timings.")
            self.wiz.hardware.judge()

        def failed(exc: BaseException) -> None:
            self.check_note.setText(describe(exc)[0])

        self.ctx.ops.run(
            actions.check_cpu(self.ctx.services),
            on_success=done,
            on_failure=failed,
            on_finally=lambda: self.check_cpu.setEnabled(True),
        )

    def show_judgement(self, judged: TierJudgement) -> None:
        self.chart.set_judgement(judged)
        self.completeChanged.emit()
        QTimer.singleShot(0, self.show_pick)  # once the chart has its height

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        QTimer.singleShot(0, self.show_pick)  # judged before the page had its size

    def show_pick(self) -> None:
        """Scroll the chart to the preselected tier's row (it may be the 9th of 10)."""
        top = self.chart.pick_top()
        if top is None:
            return
        bar = self.chart_scroll.verticalScrollBar()
        room = self.chart_scroll.viewport().height()
        row = self.chart.ROW
        if bar.value() <= top - 4 and top + row <= bar.value() + room:
            return  # in view already
        # the first row boundary from which the picked row shows whole (no row cut at the top)
        k = max(0, -(-(top + row - room - 24) // row))
        bar.setValue(min(24 + k * row, top - 4))

    def isComplete(self) -> bool:
        return self.wiz.hardware.judgement is not None

    def nextId(self) -> int:
        return int(Step.CLUSTER if self.several.isChecked() else Step.TIERS)
