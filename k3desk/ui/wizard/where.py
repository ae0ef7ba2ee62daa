"""The wizard's "Where and how" step: the download folder and its free space, the Hugging Face
token for gated repositories, and how many files at once.

It names the tier it judges, and measures the folder again each time it is shown (the
tier may have changed).  Too little space is a warning with the numbers and the choices
(another folder, a smaller tier, files already here), never a locked Next: the disk may
be freed meanwhile, or the files are elsewhere already.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QSpinBox,
)

from k3desk.core.app.actions import measure_disk
from k3desk.core.app.hub_choice import folder_for
from k3desk.core.app.operations import Change, OpChanges
from k3desk.core.app.values import fmt_bytes
from k3desk.ui.tokens import TokenAccess
from k3desk.ui.widgets import Banner, label, muted, set_enabled
from k3desk.ui.wizard.base import StepPage

if TYPE_CHECKING:
    from k3desk.core.app.hardware import DiskInfo
    from k3desk.ui.context import AppContext
    from k3desk.ui.wizard.wizard import TierWizard


class WherePage(StepPage):
    def __init__(self, ctx: AppContext, wizard: TierWizard) -> None:
        super().__init__(
            ctx,
            wizard,
            "Where and how",
            "Where the shards go, the token for gated repositories, and how many files at once.",
        )
        self.tier_line = label("", "whereTier")
        self.lay.addWidget(self.tier_line)
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
        self.shortfall = Banner()
        self.shortfall.setObjectName("diskShortfall")
        self.lay.addWidget(self.shortfall)
        srow = QHBoxLayout()
        self.have = QPushButton("I already have the files…")
        self.have.setObjectName("whereHaveFiles")
        self.have.setToolTip("Add the GGUF files you have to My models instead of downloading")
        srow.addWidget(self.have)
        srow.addStretch(1)
        self.lay.addLayout(srow)
        self.cluster_note = Banner()
        self.cluster_note.setObjectName("clusterNote")
        self.lay.addWidget(self.cluster_note)
        self.lay.addStretch(1)
        self.tokens = TokenAccess(ctx.token_store)
        browse.clicked.connect(self._browse)
        self.have.clicked.connect(wizard.have_files)
        self.folder.textChanged.connect(self._folder_changed)
        self.token_save.clicked.connect(self._save_token)
        ctx.ops.did_execute.connect(self._changed)
        self.token_edit.textChanged.connect(
            lambda t: set_enabled(self.token_save, bool(t.strip()), "Paste a token first.")
        )
        set_enabled(self.token_save, False, "Paste a token first.")
        self._short = False  # the folder has less free space than the tier needs
        self._gen = 0  # the newest disk measurement (older answers are dropped)

    def initializePage(self) -> None:
        s = self.ctx.settings
        row = self.wiz.selected_tier()
        hub = self.wiz.hub_set()
        self.tier_line.setText(
            f"For {hub.remote.name} from {hub.repo} at commit {hub.revision[:12]}: "
            f"{hub.remote.count} parts, {fmt_bytes(hub.remote.total_bytes)}."
            if hub is not None
            else f"For {row.tier.publisher} {row.tier.name}: {row.tier.shard_count} shards, "
            f"{fmt_bytes(row.tier.size_bytes)}."
            if row is not None
            else "No tier chosen: go Back to pick one."
        )
        self.folder.blockSignals(True)
        self.folder.setText(str(s.effective_download_dir(self.ctx.services.paths.models_dir)))
        self.folder.blockSignals(False)
        self._folder_changed()  # the tier may be another one than last time: measure again
        self.parallel.setValue(s.download_workers)
        self.ctx.ops.run(self.tokens.describe_op(), on_success=self._token_shown)
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
        def done(message: str) -> None:
            self.token_edit.clear()
            self.banner.show_text(message)
            self.initializePage()

        value = self.token_edit.text().strip()
        self.ctx.ops.run(self.tokens.save_op(value), on_success=done, initiator=self)

    def _changed(self, changes: OpChanges, initiator: object) -> None:
        if changes.touches(Change.TOKEN) and initiator is not self:  # saved in Settings
            self.ctx.ops.run(self.tokens.describe_op(), on_success=self._token_shown)

    def _browse(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Download folder", self.folder.text())
        if d:
            self.folder.setText(d)

    def target(self) -> Path:
        tier = self.wiz.selected_tier()
        hub = self.wiz.hub_set()
        base = Path(self.folder.text().strip()).expanduser()
        if hub is not None:
            return base / folder_for(hub)
        return base / tier.tier.id if tier is not None else base

    def _folder_changed(self) -> None:

        path = Path(self.folder.text().strip() or ".").expanduser()
        tv = self.wiz.selected_tier()
        hub = self.wiz.hub_set()
        need = tv.tier.size_bytes if tv is not None else 0
        name = f"{tv.tier.publisher} {tv.tier.name}" if tv is not None else "the tier"
        if hub is not None:
            need, name = hub.remote.total_bytes, f"{hub.repo} {hub.remote.name}"
        self._gen += 1
        gen = self._gen

        def done(disk: DiskInfo) -> None:
            if gen != self._gen:
                return  # the folder or the tier changed meanwhile
            short = disk.free < need
            optional = self.download_optional()
            text = f"{fmt_bytes(disk.free)} free on {disk.probed_path}"
            if need and not (short and not optional):  # a shortfall: the banner says it once
                text += f"; {name} needs {fmt_bytes(need)}"
            if short and optional:
                text += (
                    " (not enough here; SparkInfer reads the nodes' own copies, so the "
                    "download may be skipped)"
                )
            self.free.setText(text)
            self.free.setObjectName("muted" if not short else "warnText")
            self.free.style().polish(self.free)
            self._short = short
            self.shortfall.show_text(
                ""
                if not short or optional
                else html.escape(
                    f"{name} needs {fmt_bytes(need)}; {fmt_bytes(disk.free)} is free on "
                    f"{disk.probed_path}, {fmt_bytes(need - disk.free)} short. Choose a "
                    "folder on a larger disk (Browse…), go Back for a smaller tier, or use "
                    "files you already have. You may also go on: the download stops with a "
                    "message if the disk fills."
                )
            )
            self.completeChanged.emit()

        self.ctx.ops.run(measure_disk(path), on_success=done)

    def download_optional(self) -> bool:
        """SparkInfer on a cluster reads each node's own copy: a download here is optional."""
        wiz = self.wiz
        return wiz.cluster_mode and wiz.cluster.view.choice().engine == "sparkinfer"

    def isComplete(self) -> bool:
        # a shortfall is a warning (see the module docstring), never a locked Next
        return bool(self.folder.text().strip())

    def validatePage(self) -> bool:
        folder = self.folder.text().strip()
        try:
            self.ctx.update_settings(download_dir=folder, download_workers=self.parallel.value())
        except Exception as exc:  # noqa: BLE001 - shown to the user, page stays
            self.ctx.reporter.report(exc)
            return False
        return True
