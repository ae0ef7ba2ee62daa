"""The cluster engine on the Engine page: every rank or worker with its host, role and
state, SparkInfer's readiness phases as progress, the speed rank 0 reports, the
address to chat with, and stop / restart of the whole set.

Hidden until a cluster engine has been started from the Cluster page.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QWidget,
)

from k3desk.core.app.clusters import (
    PHASE_TEXT,
    GroupEvent,
    GroupState,
    ServeStats,
    SparkInferCluster,
    launch_fraction,
)
from k3desk.core.app.presenters.cluster_engine import MEMBER_COLUMNS, member_cells
from k3desk.ui import theme
from k3desk.ui.cells import cell_item
from k3desk.ui.widgets import Card, CopyField, label, muted, set_enabled

if TYPE_CHECKING:
    from k3desk.ui.cluster.controller import ClusterController
    from k3desk.ui.context import AppContext


def stats_text(s: ServeStats) -> str:
    """One serve line of rank 0, in words."""
    return (
        f"Last answer: {s.generated_tokens} tokens at {s.decode_tokens_per_s:.1f} tok/s "
        f"(decode {s.decode_s:.2f} s); prompt {s.prompt_tokens} tokens at "
        f"{s.prefill_tokens_per_s:.0f} tok/s (prefill {s.prefill_s:.2f} s) — rank 0's log"
    )


def state_line(state: str, message: str) -> str:
    """ "Ready at http://…", "Restarting: rank 2 … killed by SIGKILL; restarting every member"."""
    if not message:
        return state[:1].upper() + state[1:]
    if message.lower().startswith(state.lower()):
        return message[:1].upper() + message[1:]
    return f"{state[:1].upper()}{state[1:]}: {message}"


class ClusterEngineView(Card):
    """The running (or last) cluster engine, watched through the cluster controller."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.controller: ClusterController = ctx.cluster
        self._stages: list[str] = []
        self._group: object = None
        b = self.body
        head = QHBoxLayout()
        self.title = label("", "sectionTitle")
        head.addWidget(self.title, 1)
        self.restart_btn = QPushButton("Restart all")
        self.restart_btn.setObjectName("restartCluster")
        self.stop_btn = QPushButton("Stop all")
        self.stop_btn.setObjectName("stopCluster")
        self.stop_btn.setProperty("danger", True)
        head.addWidget(self.restart_btn)
        head.addWidget(self.stop_btn)
        b.addLayout(head)
        self.state = label("", selectable=True)
        self.state.setObjectName("clusterEngineState")
        b.addWidget(self.state)
        self.phases = label("")
        self.phases.setObjectName("clusterPhases")
        self.phases.setTextFormat(Qt.TextFormat.RichText)
        b.addWidget(self.phases)
        self.bar = QProgressBar()
        self.bar.setObjectName("clusterProgress")
        self.bar.setRange(0, 1000)
        b.addWidget(self.bar)
        self.members = QTableWidget(0, len(MEMBER_COLUMNS))
        self.members.setObjectName("memberTable")
        self.members.setHorizontalHeaderLabels(MEMBER_COLUMNS)
        self.members.verticalHeader().setVisible(False)
        self.members.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.members.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.members.setWordWrap(False)
        hh = self.members.horizontalHeader()
        for col in range(len(MEMBER_COLUMNS)):
            hh.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        b.addWidget(self.members)
        self.speed = muted("")
        b.addWidget(self.speed)
        self.url = CopyField("")
        self.url.setObjectName("clusterUrl")
        b.addWidget(self.url)
        # the bridge's K3_API_KEY (kept in the keyring), hidden until asked, like the local key
        self.key = CopyField("", secret=True)
        self.key.setObjectName("clusterKey")
        self.key.setToolTip("The API key clients send as 'Authorization: Bearer KEY'")
        b.addWidget(self.key)
        self.log = QPlainTextEdit()
        self.log.setObjectName("clusterEvents")
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(500)
        self.log.setMaximumHeight(110)
        b.addWidget(self.log)

        self.timer = QTimer(self)
        self.timer.setObjectName("cluster-members")
        self.timer.setInterval(1000)
        self.timer.timeout.connect(self._members)
        self.stop_btn.clicked.connect(lambda: self.controller.stop())
        self.restart_btn.clicked.connect(self.controller.restart)
        self.controller.group_changed.connect(self.refresh)
        self.controller.group_event.connect(self._event)
        self.controller.stats.connect(self._stats)
        self.refresh()
        for ev in self.controller.events:
            self._event(ev)
        self._phases()

    # --------------------------------------------------------------- state
    def refresh(self) -> None:
        ctl = self.controller
        group = ctl.group
        self.setVisible(group is not None)
        if group is None:
            self.timer.stop()
            self._stages = []
            return
        if group is not self._group:  # a new start: new phases and events
            self._group = group
            self._stages = []
            self.log.clear()
        state = group.state
        self.title.setText(f"Cluster engine: {ctl.group_title} on {ctl.group_cluster}")
        last = ctl.events[-1] if ctl.events else None
        message = last.message if last is not None and last.progress is None else ""
        text = "stopping every process…" if ctl.stopping else state.value
        if state is GroupState.FAILED and group.error is not None:
            message = f"{group.error.message} {group.error.hint}".strip()
        self.state.setText(state_line(text, message))
        c = theme.current()
        color = {
            GroupState.READY: c.ok,
            GroupState.FAILED: c.danger,
            GroupState.RESTARTING: c.warn,
        }.get(state, c.text)
        self.state.setStyleSheet(f"color: {color};")
        p = ctl.last_progress
        if state is GroupState.READY:
            self.bar.setValue(1000)
            self.bar.setFormat("ready")
        elif p is not None:
            self.bar.setValue(int(launch_fraction(p) * 1000))
            self.bar.setFormat(f"{p.stage}: {p.detail}" if p.detail else p.stage)
        else:
            self.bar.setValue(0)
            self.bar.setFormat(text)
        self.bar.setVisible(state is not GroupState.STOPPED)
        self._phases()
        ep = group.endpoint
        self.url.set_text(f"{ep.root}/v1" if ep is not None else "Not ready")
        self.url.copy.setEnabled(ep is not None)
        key = ep.api_key if ep is not None else None
        self.key.set_text(key or "")
        self.key.copy.setEnabled(bool(key))
        self.key.setVisible(bool(key))
        if ctl.last_stats is None:
            self.speed.setText(
                "Speed: rank 0 logs it after each answer."
                if isinstance(group, SparkInferCluster)
                else "Speed: shown with each answer in the chat."
            )
        running = ctl.group_running and not ctl.stopping
        set_enabled(self.stop_btn, running, "Nothing is running.")
        set_enabled(
            self.restart_btn,
            not ctl.stopping,
            "It is stopping.",
            "Stop every process and start them all again",
        )
        if running:
            self.timer.start()
        else:
            self.timer.stop()
        self._members()

    def _phases(self) -> None:
        group = self.controller.group
        c = theme.current()
        p = self.controller.last_progress
        ready = group is not None and group.state is GroupState.READY
        if isinstance(group, SparkInferCluster):
            steps = list(PHASE_TEXT)
            current = steps.index(p.stage) if p is not None and p.stage in steps else -1
            if p is not None and p.stage == PHASE_TEXT[-1]:
                current = len(steps) - 1
        else:
            steps = list(self._stages)
            current = len(steps) - 1
        lines = []
        for i, step in enumerate(steps):
            done = ready or i < current
            if done:
                mark, color = "✓", c.ok
            elif i == current:
                mark, color = "●", c.accent
            else:
                mark, color = "○", c.muted
            detail = ""
            if i == current and not done and p is not None and p.detail and p.stage == step:
                detail = f" — {html.escape(p.detail)}"
            lines.append(f"<span style='color:{color}'>{mark}</span> {html.escape(step)}{detail}")
        self.phases.setText("<br>".join(lines))
        self.phases.setVisible(bool(lines))

    def _members(self) -> None:
        rows = self.controller.members()
        self.members.setRowCount(len(rows))
        for i, m in enumerate(rows):
            for j, cell in enumerate(member_cells(m)):
                self.members.setItem(i, j, cell_item(cell))
        rows_h = sum(self.members.rowHeight(r) for r in range(self.members.rowCount()))
        self.members.setFixedHeight(self.members.horizontalHeader().height() + rows_h + 6)

    def _event(self, ev: GroupEvent) -> None:
        stamp = time.strftime("%H:%M:%S")
        if ev.progress is not None:
            stage = ev.progress.stage
            if stage not in self._stages:
                self._stages.append(stage)
            detail = f": {ev.progress.detail}" if ev.progress.detail else ""
            line = f"{stamp}  {stage}{detail}"
        else:
            line = f"{stamp}  [{ev.state.value}] {ev.message}".rstrip()
        self.log.appendPlainText(line)

    def _stats(self, s: ServeStats) -> None:
        self.speed.setText(stats_text(s))
