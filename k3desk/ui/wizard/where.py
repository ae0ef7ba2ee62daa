"""The wizard's "Where and how" step: the download folder and its free space, the Hugging Face
token for gated repositories, and how many files at once."""

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

from k3desk.core.units import fmt_bytes
from k3desk.ui.tokens import TokenAccess
from k3desk.ui.widgets import Banner, muted, set_enabled
from k3desk.ui.wizard.base import StepPage

if TYPE_CHECKING:
    from k3desk.core.hardware.profile import DiskInfo
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
        self._short = False  # the folder has less free space than the tier needs

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

        def done(disk: DiskInfo) -> None:
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
        short = self._short and not self.download_optional()
        return bool(self.folder.text().strip()) and not short

    def validatePage(self) -> bool:
        folder = self.folder.text().strip()
        try:
            self.ctx.update_settings(download_dir=folder, download_workers=self.parallel.value())
        except Exception as exc:  # noqa: BLE001 - shown to the user, page stays
            self.ctx.reporter.report(exc)
            return False
        return True
