"""The tier-picker wizard: your machine -> [your cluster] -> tiers -> where and how ->
download -> engine.

Every number comes from core (hardware detection, the catalog, the planner's
recommendation, the cluster's probe and assessment, the download job, engine
probes and the supervisors); the pages only lay them out.  With "Several
machines" chosen on the first page, the cluster step embeds the Cluster page's
editor, probe and verdict, the tiers step judges every tier for that cluster
and engine, and the engine step starts the engine on the cluster.
"""

from __future__ import annotations

import html
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QButtonGroup,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QSpinBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from k3desk.core.errors import K3Error
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.hub.model import DownloadRequest
from k3desk.core.planning.recommend import Recommendation, TierVerdict
from k3desk.core.units import fmt_bytes
from k3desk.ui.cluster.assessment import AssessmentView
from k3desk.ui.cluster.controller import LaunchChoice, TierOnCluster
from k3desk.ui.downloads.panel import DownloadPanel
from k3desk.ui.tiers import SPARKINFER_ONLY, TierTable, cluster_verdict_text, verdict_text
from k3desk.ui.tokens import TokenAccess
from k3desk.ui.widgets import Banner, Card, label, muted, primary, set_enabled
from k3desk.ui.wizard.fitchart import FitChart

if TYPE_CHECKING:
    from k3desk.ui.cluster.page import ClusterPage
    from k3desk.ui.context import AppContext

MACHINE, CLUSTER, TIERS, WHERE, DOWNLOAD, ENGINE = range(6)
PAGE_KEYS = ("machine", "cluster", "tiers", "where", "download", "engine")
CLUSTER_ORDER_RULE = (
    "Same quality order as for one machine. The verdict is the engine's own refusals and "
    "the cluster's memory plan from the probe."
)
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
        card.body.addLayout(row)
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
        card.body.addLayout(run)
        self.lay.addWidget(card)
        self.chart = FitChart()
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(self.chart)
        self.lay.addWidget(scroll, 1)
        self.other.clicked.connect(wizard.choose_hardware_file)
        self.this.clicked.connect(lambda: wizard.hardware.detect())

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

    def nextId(self) -> int:
        return CLUSTER if self.several.isChecked() else TIERS


class ClusterStepPage(_Page):
    """The Cluster page's clusters part (list, editor, probe, engine choice, verdict)."""

    def __init__(self, ctx: AppContext, wizard: TierWizard) -> None:
        from k3desk.ui.cluster.page import ClusterPage

        super().__init__(
            ctx,
            wizard,
            "Your machines",
            "Pick or add the cluster (nodes reached over SSH, keys only), probe it and choose "
            "the engine. The next steps judge every tier for it and start it there.",
        )
        self.view: ClusterPage = ClusterPage(ctx, None, embedded=True)
        self.view.setObjectName("wizardCluster")
        self.lay.addWidget(self.view, 1)
        self.view.changed.connect(self.completeChanged)

    def initializePage(self) -> None:
        self.view.activated()

    def isComplete(self) -> bool:
        return self.view.current() is not None


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
        self.other = QPushButton("Plan for other hardware…")
        self.other.clicked.connect(wizard.choose_hardware_file)
        row.addWidget(self.other)
        self.lay.addLayout(row)
        self.table.tier_selected.connect(self._selected)
        self.shown = ""  # what the table judges: "machine" or "cluster:<name>:<engine>"

    def initializePage(self) -> None:
        wiz = self.wiz
        key = wiz.plan_key()
        keep = self.table.current() if key == self.shown else None
        if wiz.cluster_mode:
            self.setSubTitle(
                "Every published Kimi-K3 quantization, judged for the cluster and its engine. "
                "The one that runs best there is preselected."
            )
            self.show_cluster()
        else:
            self.setSubTitle(
                "Every published Kimi-K3 quantization, judged for this machine. "
                "The recommended one is preselected."
            )
            rec = wiz.hardware.recommendation
            if key != self.shown and rec is not None:
                self.show_recommendation(rec)
        self.other.setVisible(not wiz.cluster_mode)
        if keep is not None:
            self.table.select_tier(keep.tier.id)

    def show_recommendation(self, rec: Recommendation) -> None:
        self.shown = "machine"
        self.reason.setText(rec.summary)
        self.rule.setText(rec.ordering_rule)
        self.rule.setToolTip(rec.ordering_rule)
        self.table.set_recommendation(rec)
        self.completeChanged.emit()

    def show_cluster(self) -> None:
        """Judge every tier for the wizard's cluster and engine (the core's assessment)."""
        wiz = self.wiz
        view = wiz.cluster.view
        name = view.current_name() or ""
        choice = view.choice()
        rec = wiz.hardware.recommendation
        tiers = (
            [tv.tier for tv in rec.verdicts]
            if rec is not None
            else list(self.ctx.services.catalog.tiers)
        )
        self.shown = wiz.plan_key()
        try:
            rows = view.controller.judge_tiers(name, choice, tiers)
        except K3Error as exc:
            self.reason.setText(f"{exc.message} {exc.hint}".strip())
            self.table.set_cluster([], None)
            self.completeChanged.emit()
            return
        candidates = [r for r in rows if not r.tier.reference]
        best = next((r for r in candidates if r.fits), None) or next(
            (r for r in candidates if r.runs), None
        )
        self.table.set_cluster(rows, best)
        self.reason.setText(cluster_summary(name, choice, rows, best))
        self.rule.setText(CLUSTER_ORDER_RULE)
        self.rule.setToolTip(CLUSTER_ORDER_RULE)
        self.completeChanged.emit()

    def _selected(self, tv: TierVerdict | TierOnCluster) -> None:
        if isinstance(tv, TierOnCluster):
            self._selected_on_cluster(tv)
            return
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
        if t.files_guessed:
            lines.append(
                f"<p><b>{html.escape(t.files_guessed[:1].upper() + t.files_guessed[1:])}.</b> "
                "The download takes whatever its patterns match and checks what it can.</p>"
            )
        if tv.basis is not None:
            lines.append(f"<p>Its rank rests on: {html.escape(tv.basis.text())}.</p>")
        if t.quality_caveat:
            lines.append(f"<p>Quality figures (*): {t.quality_caveat}</p>")
        if t.caveats:
            lines.append("<p>" + " ".join(t.caveats[:2]) + "</p>")
        self.details.setHtml("".join(lines))
        self.completeChanged.emit()

    def _selected_on_cluster(self, row: TierOnCluster) -> None:
        t = row.tier
        a = row.assessment
        esc = html.escape
        lines = [
            f"<b>{esc(t.name)}</b> by {esc(t.publisher)} · "
            f"<a href='https://huggingface.co/{t.repo}'>{esc(t.repo)}</a>",
            f"<p>{esc(a.title)}: {esc(cluster_verdict_text(row))}</p>",
        ]
        if a.refusals:
            lines.append("<ul>" + "".join(f"<li>✗ {esc(r)}</li>" for r in a.refusals) + "</ul>")
        if a.warnings:
            lines.append("<ul>" + "".join(f"<li>! {esc(w)}</li>" for w in a.warnings) + "</ul>")
        if a.plan is not None:
            lines.append("<p>" + " ".join(esc(n) for n in a.plan.notes) + "</p>")
        if t.quality_caveat:
            lines.append(f"<p>Quality figures (*): {esc(t.quality_caveat)}</p>")
        self.details.setHtml("".join(lines))
        # the cluster step checks the copies of the tier chosen here
        combo = self.wiz.cluster.view.tier
        combo.setCurrentIndex(max(0, combo.findData(t.id)))
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return self.table.current() is not None


def cluster_summary(
    name: str, choice: LaunchChoice, rows: list[TierOnCluster], best: TierOnCluster | None
) -> str:
    """The tiers step's headline for a cluster: engine, SparkInfer's one tier, the pick."""
    title = rows[0].assessment.title if rows else choice.engine
    text = f"Judged for cluster {name} with {title}."
    if choice.engine == "sparkinfer":
        text += (
            f" {SPARKINFER_ONLY} tier (the pruned 9-shard set); run any other tier with "
            "llama.cpp RPC (choose it on the previous step) or on one machine."
        )
    if best is not None:
        text += f" Preselected: {best.tier.name} by {best.tier.publisher}, "
        text += f"{cluster_verdict_text(best)}."
    else:
        text += " Nothing can start on this cluster yet: each tier's verdict says why."
    if rows and not rows[0].assessment.probed:
        text += " Probe the cluster on the previous step for its memory plan."
    return text


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
        self.cluster_note = Banner()
        self.cluster_note.setObjectName("clusterNote")
        self.lay.addWidget(self.cluster_note)
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
        self._cluster_note()

    def _cluster_note(self) -> None:
        """Where the files must be for the cluster's engine."""
        wiz = self.wiz
        cluster = wiz.cluster.view.current() if wiz.cluster_mode else None
        if cluster is None:
            self.cluster_note.hide()
            return
        if wiz.cluster.view.choice().engine == "sparkinfer":
            folders = html.escape(
                ", ".join(f"{n.label}:{n.model_path or '?'}" for n in cluster.nodes)
            )
            self.cluster_note.show_text(
                f"SparkInfer loads the model from each node's own folder ({folders}). Download "
                "it here and copy the folder to every node, or skip the download on the next "
                "step when the probe found complete copies."
            )
        else:
            self.cluster_note.show_text(
                "llama.cpp RPC needs the files on this machine only: llama-server runs here and "
                "sends the layers to the workers over the network."
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
            optional = self.download_optional()
            text = f"{fmt_bytes(disk.free)} free on {disk.probed_path}"
            if need:
                text += f"; the tier needs {fmt_bytes(need)}"
            if short:
                text += (
                    " (not enough here; SparkInfer reads the nodes' own copies, so the "
                    "download may be skipped)"
                    if optional
                    else " (not enough)"
                )
            self.free.setText(text)
            self.free.setObjectName(
                "muted" if not short else "warnText" if optional else "errorText"
            )
            self.free.style().polish(self.free)
            self._short = short
            self.completeChanged.emit()

        self.ctx.tasks.run(lambda _t: detect_disk(path), on_done=done, name="disk")

    def download_optional(self) -> bool:
        """SparkInfer on a cluster reads each node's own copy: a download here is optional."""
        wiz = self.wiz
        return wiz.cluster_mode and wiz.cluster.view.choice().engine == "sparkinfer"

    def isComplete(self) -> bool:
        short = getattr(self, "_short", False) and not self.download_optional()
        return bool(self.folder.text().strip()) and not short

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


class ClusterLaunch(QWidget):
    """The engine step for a cluster: the verdict for the chosen tier, Start, and the
    running engine's ranks, phases and progress (the Engine page's cluster view)."""

    def __init__(self, ctx: AppContext) -> None:
        from k3desk.ui.cluster.engine_view import ClusterEngineView

        super().__init__()
        self.ctx = ctx
        self.controller = ctx.controller("cluster")
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
        self.setSubTitle(
            "The llama-server that will run Kimi-K3: found, probed, built if needed, "
            "and launched with the plan."
        )
        tv = wiz.selected_tier()
        self.panel.set_tier(tv.tier if tv is not None else None)
        target = wiz.where.target()
        self.panel.set_model_folder(target)
        self.panel.refresh_engines()


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
        self.cluster = ClusterStepPage(ctx, self)
        self.tiers = TiersPage(ctx, self)
        self.where = WherePage(ctx, self)
        self.download = DownloadPage(ctx, self)
        self.engine = EnginePage(ctx, self)
        pages = (self.machine, self.cluster, self.tiers, self.where, self.download, self.engine)
        for page_id, page in enumerate(pages):
            self.setPage(page_id, page)
        self.hardware.changed.connect(self._profile)
        self.hardware.recommended.connect(self._recommended)
        if self.hardware.profile is not None:
            self._profile(self.hardware.profile)
        if self.hardware.recommendation is not None:
            self._recommended(self.hardware.recommendation)
        self.hardware.ensure()
        self.accepted.connect(self._done)

    def current_key(self) -> str:
        cur = self.currentId()
        return PAGE_KEYS[cur] if 0 <= cur < len(PAGE_KEYS) else ""

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

    def selected_tier(self) -> TierVerdict | TierOnCluster | None:
        return self.tiers.table.current()

    def cluster_choice(self) -> LaunchChoice:
        """The cluster step's engine choice for the tier picked on the tiers step; for
        llama.cpp RPC the model is the first shard in the download folder unless one was
        chosen on the cluster step."""
        from k3desk.ui.engine.page import find_model

        choice = self.cluster.view.choice()
        tv = self.selected_tier()
        if tv is not None:
            choice = replace(choice, tier_id=tv.tier.id)
        if choice.engine == "rpc" and not choice.model:
            shard, _proj = find_model(self.where.target())
            if shard is not None:
                choice = replace(choice, model=str(shard))
        return choice

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
        if not self.cluster_mode:
            self.tiers.show_recommendation(rec)
        elif self.currentId() == TIERS:
            self.tiers.show_cluster()
        else:
            self.tiers.shown = ""  # judged again when the tiers step is shown

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
