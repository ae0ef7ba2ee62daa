"""The tier-picker wizard: your machine -> tiers -> where and how -> download -> engine.

Every number comes from core (hardware detection, the catalog, the planner's
recommendation, the download job, engine probes and the supervisor); the pages
only lay them out.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.hub.model import DownloadRequest
from k3desk.core.planning.recommend import Recommendation, TierVerdict
from k3desk.core.units import fmt_bytes
from k3desk.ui.downloads.panel import DownloadPanel
from k3desk.ui.tiers import TierTable, verdict_text
from k3desk.ui.tokens import TokenAccess
from k3desk.ui.widgets import Banner, Card, label, muted, primary, set_enabled
from k3desk.ui.wizard.fitchart import FitChart

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext

PAGE_KEYS = ("machine", "tiers", "where", "download", "engine")
HW_FILTER = "Hardware description (*.json);;All files (*)"


def machine_html(hw: HardwareProfile) -> str:
    """The machine summary as rich text (RAM, each GPU, CPU features, free disk)."""
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
    if hw.disk is not None:
        rows.append(
            (
                "Disk",
                f"{fmt_bytes(hw.disk.free)} free of {fmt_bytes(hw.disk.total)} at "
                f"{hw.disk.path} ({hw.disk.filesystem or 'unknown filesystem'})",
            )
        )
    body = "".join(
        f"<tr><td style='padding:2px 14px 2px 0;'><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows
    )
    return f"<table>{body}</table>"


class _Page(QWizardPage):
    def __init__(self, ctx: AppContext, wizard: TierWizard, title: str, sub: str) -> None:
        super().__init__()
        self.ctx = ctx
        self.wiz = wizard
        self.setTitle(title)
        self.setSubTitle(sub)
        self.lay = QVBoxLayout(self)
        self.lay.setSpacing(10)


class MachinePage(_Page):
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
        row = QHBoxLayout()
        self.source = muted("")
        row.addWidget(self.source, 1)
        self.other = QPushButton("Plan for other hardware…")
        self.other.setObjectName("otherHardware")
        self.other.setToolTip("Load a hardware file (k3desk doctor --json) to plan for it")
        self.this = QPushButton("This machine")
        self.this.setToolTip("Plan for the machine k3desk runs on")
        row.addWidget(self.this)
        row.addWidget(self.other)
        self.cluster = QPushButton("Use several machines…")
        self.cluster.setObjectName("useCluster")
        self.cluster.setToolTip(
            "Run Kimi-K3 across machines reached over SSH, or chat with a server that runs it"
        )
        row.addWidget(self.cluster)
        card.body.addLayout(row)
        self.lay.addWidget(card)
        self.chart = FitChart()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(self.chart)
        self.lay.addWidget(scroll, 1)
        self.other.clicked.connect(wizard.choose_hardware_file)
        self.this.clicked.connect(lambda: wizard.hardware.detect())
        self.cluster.clicked.connect(wizard.use_cluster)

    def show_profile(self, hw: HardwareProfile) -> None:
        self.summary.setText(machine_html(hw))
        src = self.wiz.hardware.from_file
        self.source.setText(
            f"Planning for the machine described in {src}" if src else "Planning for this machine."
        )
        self.this.setEnabled(src is not None)

    def show_recommendation(self, rec: Recommendation, hw: HardwareProfile) -> None:
        self.chart.set_data(rec, hw)
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return self.wiz.hardware.recommendation is not None


class TiersPage(_Page):
    def __init__(self, ctx: AppContext, wizard: TierWizard) -> None:
        super().__init__(
            ctx,
            wizard,
            "Tiers",
            "Every published Kimi-K3 quantization, judged for this machine. "
            "The recommended one is preselected.",
        )
        self.reason = label("Planning…")
        self.reason.setObjectName("recommendation")
        self.lay.addWidget(self.reason)
        self.table = TierTable()
        self.lay.addWidget(self.table, 1)
        self.details = QTextBrowser()
        self.details.setObjectName("tierDetails")
        self.details.setMaximumHeight(150)
        self.details.setOpenExternalLinks(True)
        self.lay.addWidget(self.details)
        row = QHBoxLayout()
        self.rule = muted("")
        row.addWidget(self.rule, 1)
        other = QPushButton("Plan for other hardware…")
        other.clicked.connect(wizard.choose_hardware_file)
        row.addWidget(other)
        self.lay.addLayout(row)
        self.table.tier_selected.connect(self._selected)

    def show_recommendation(self, rec: Recommendation) -> None:
        self.reason.setText(rec.summary)
        self.rule.setText(rec.ordering_rule)
        self.rule.setToolTip(rec.ordering_rule)
        self.table.set_recommendation(rec)
        self.completeChanged.emit()

    def _selected(self, tv: TierVerdict) -> None:
        t = tv.tier
        lines = [
            f"<b>{t.name}</b> by {t.publisher} · <a href='https://huggingface.co/{t.repo}'>"
            f"{t.repo}</a>",
            f"<p>{tv.reason}</p>",
        ]
        if tv.why_not:
            lines.append(f"<p><i>Not recommended: {tv.why_not}</i></p>")
        if tv.plan is not None and tv.plan.notes:
            lines.append("<ul>" + "".join(f"<li>{n}</li>" for n in tv.plan.notes[:4]) + "</ul>")
        if not t.known:
            lines.append(
                "<p><b>The card lists this tier without its exact files and sizes:</b> "
                "the download takes whatever its patterns match and checks what it can.</p>"
            )
        if t.quality_caveat:
            lines.append(f"<p>Quality figures (*): {t.quality_caveat}</p>")
        if t.caveats:
            lines.append("<p>" + " ".join(t.caveats[:2]) + "</p>")
        self.details.setHtml("".join(lines))
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return self.table.current() is not None


class WherePage(_Page):
    def __init__(self, ctx: AppContext, wizard: TierWizard) -> None:
        super().__init__(
            ctx,
            wizard,
            "Where and how",
            "Where the shards go, the token for gated repositories, and how many files at once.",
        )
        form = QFormLayout()
        self.folder = QLineEdit()
        self.folder.setObjectName("downloadFolder")
        browse = QPushButton("Browse…")
        row = QHBoxLayout()
        row.addWidget(self.folder, 1)
        row.addWidget(browse)
        form.addRow("Download folder", row)
        self.free = muted("")
        self.free.setObjectName("freeSpace")
        form.addRow("", self.free)
        self.token_state = QLineEdit()
        self.token_state.setReadOnly(True)
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("hf_… (only for gated or private repositories)")
        self.token_save = QPushButton("Save token")
        trow = QHBoxLayout()
        trow.addWidget(self.token_state, 1)
        trow.addWidget(self.token_edit, 1)
        trow.addWidget(self.token_save)
        form.addRow("Hugging Face token", trow)
        self.parallel = QSpinBox()
        self.parallel.setRange(1, 16)
        self.parallel.setToolTip("Shards downloaded at the same time")
        form.addRow("Parallel downloads", self.parallel)
        self.lay.addLayout(form)
        self.banner = Banner()
        self.lay.addWidget(self.banner)
        self.lay.addStretch(1)
        self.tokens = TokenAccess(ctx.token_store)
        browse.clicked.connect(self._browse)
        self.folder.textChanged.connect(self._folder_changed)
        self.token_save.clicked.connect(self._save_token)
        self.token_edit.textChanged.connect(
            lambda t: set_enabled(self.token_save, bool(t.strip()), "Paste a token first.")
        )
        set_enabled(self.token_save, False, "Paste a token first.")

    def initializePage(self) -> None:
        s = self.ctx.settings
        self.folder.setText(str(s.effective_download_dir(self.ctx.services.paths.models_dir)))
        self.parallel.setValue(s.download_workers)
        self.ctx.tasks.run(
            lambda _t: self.tokens.describe(), on_done=self._token_shown, name="token-state"
        )

    def _token_shown(self, state: tuple[str, str]) -> None:
        self.token_state.setText(state[0] or "No token saved")
        self.token_state.setToolTip(state[1])

    def _save_token(self) -> None:
        value = self.token_edit.text().strip()

        def done(message: str) -> None:
            self.token_edit.clear()
            self.banner.show_text(message)
            self.initializePage()

        self.ctx.tasks.run(lambda _t: self.tokens.save(value), on_done=done, name="token-save")

    def _browse(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Download folder", self.folder.text())
        if d:
            self.folder.setText(d)

    def target(self) -> Path:
        tier = self.wiz.selected_tier()
        base = Path(self.folder.text().strip()).expanduser()
        return base / tier.tier.id if tier is not None else base

    def _folder_changed(self) -> None:
        from k3desk.core.hardware.detect import detect_disk

        path = Path(self.folder.text().strip() or ".").expanduser()
        tv = self.wiz.selected_tier()
        need = tv.tier.size_bytes if tv is not None else 0

        def done(disk: Any) -> None:
            short = disk.free < need
            text = f"{fmt_bytes(disk.free)} free on {disk.probed_path}"
            if need:
                text += f"; the tier needs {fmt_bytes(need)}"
            self.free.setText(text + (" (not enough)" if short else ""))
            self.free.setObjectName("errorText" if short else "muted")
            self.free.style().polish(self.free)
            self._short = short
            self.completeChanged.emit()

        self.ctx.tasks.run(lambda _t: detect_disk(path), on_done=done, name="disk")

    def isComplete(self) -> bool:
        return bool(self.folder.text().strip()) and not getattr(self, "_short", False)

    def validatePage(self) -> bool:
        folder = self.folder.text().strip()
        try:
            self.ctx.update_settings(download_dir=folder, download_workers=self.parallel.value())
        except Exception as exc:  # noqa: BLE001 - shown to the user, page stays
            self.ctx.reporter.report(exc)
            return False
        return True


class DownloadPage(_Page):
    def __init__(self, ctx: AppContext, wizard: TierWizard) -> None:
        super().__init__(
            ctx,
            wizard,
            "Download",
            "Each shard is checked against its published sha256. You can pause and "
            "come back later: the download resumes where it stopped.",
        )
        row = QHBoxLayout()
        self.start = primary(QPushButton("Start download"))
        self.start.setObjectName("startDownload")
        row.addWidget(self.start)
        self.have = QPushButton("I already have these files")
        self.have.setToolTip("Skip to the engine: the files will be checked there")
        row.addWidget(self.have)
        row.addStretch(1)
        self.lay.addLayout(row)
        self.panel = DownloadPanel(ctx)
        self.lay.addWidget(self.panel, 1)
        self.downloads = ctx.controller("downloads")
        self.start.clicked.connect(self.begin)
        self.have.clicked.connect(self._skip)
        self.downloads.changed.connect(lambda _s: self._refresh())
        self._skipped = False

    def request(self) -> DownloadRequest | None:
        tv = self.wiz.selected_tier()
        return DownloadRequest.from_tier(tv.tier) if tv is not None else None

    def initializePage(self) -> None:
        tv = self.wiz.selected_tier()
        if tv is not None:
            self.start.setText(
                f"Download {tv.tier.name}: {tv.tier.shard_count} shards, "
                f"{fmt_bytes(tv.tier.size_bytes)}"
            )
        self._refresh()

    def begin(self) -> None:
        req = self.request()
        if req is None:
            return
        try:
            self.downloads.start(req, self.wiz.where.target())
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.ctx.reporter.report(exc)
        self._refresh()

    def _skip(self) -> None:
        self._skipped = True
        self.completeChanged.emit()
        self.wiz.next()

    def _refresh(self) -> None:
        running = self.downloads.running
        set_enabled(self.start, not running, "The download is running.")
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        st = self.downloads.state
        return self._skipped or (st is not None and st.status == "done")


class EnginePage(_Page):
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
        self.load = QProgressBar()
        self.load.hide()

    def initializePage(self) -> None:
        self.panel.refresh_engines()
        target = self.wiz.where.target()
        self.panel.set_model_folder(target)


class TierWizard(QWizard):
    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.setObjectName("tierWizard")
        self.setWindowTitle("Set up Kimi-K3")
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnStartPage, True)
        self.setOption(QWizard.WizardOption.HaveHelpButton, False)
        self.resize(1100, 760)
        self.hardware = ctx.controller("hardware")
        self.machine = MachinePage(ctx, self)
        self.tiers = TiersPage(ctx, self)
        self.where = WherePage(ctx, self)
        self.download = DownloadPage(ctx, self)
        self.engine = EnginePage(ctx, self)
        for page in (self.machine, self.tiers, self.where, self.download, self.engine):
            self.addPage(page)
        self.hardware.changed.connect(self._profile)
        self.hardware.recommended.connect(self._recommended)
        if self.hardware.profile is not None:
            self._profile(self.hardware.profile)
        if self.hardware.recommendation is not None:
            self._recommended(self.hardware.recommendation)
        self.hardware.ensure()
        self.accepted.connect(self._done)

    def current_key(self) -> str:
        ids = self.pageIds()
        cur = self.currentId()
        return PAGE_KEYS[ids.index(cur)] if cur in ids else ""

    def selected_tier(self) -> TierVerdict | None:
        return self.tiers.table.current()

    def use_cluster(self) -> None:
        """Leave the wizard for the Cluster page (several machines, or an attached server)."""
        window = self.parentWidget()
        self.reject()
        show = getattr(window, "show_page", None)
        if show is not None:
            show("cluster")

    def choose_hardware_file(self) -> None:
        f, _ = QFileDialog.getOpenFileName(
            self,
            "Plan for other hardware",
            str(self.ctx.services.resources / "hardware"),
            HW_FILTER,
        )
        if f:
            self.hardware.load_file(f)

    def _profile(self, hw: HardwareProfile) -> None:
        self.machine.show_profile(hw)

    def _recommended(self, rec: Recommendation) -> None:
        hw = self.hardware.profile
        if hw is not None:
            self.machine.show_recommendation(rec, hw)
        self.tiers.show_recommendation(rec)

    def _done(self) -> None:
        tv = self.selected_tier()
        changes: dict[str, Any] = {"wizard_done": True}
        if tv is not None:
            changes["tier_id"] = tv.tier.id
        try:
            self.ctx.update_settings(**changes)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.ctx.reporter.report(exc)


def verdict_label(tv: TierVerdict) -> str:
    return verdict_text(tv)
