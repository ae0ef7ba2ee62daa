"""The wizard's download step: start (or resume) the tier's download, or skip it for files
already here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QHBoxLayout, QPushButton

from k3desk.core.app.downloads import DownloadRequest
from k3desk.core.app.hub_choice import download_request_for, projector_note
from k3desk.core.app.values import fmt_bytes
from k3desk.ui.downloads.panel import DownloadPanel
from k3desk.ui.widgets import muted, primary, set_enabled
from k3desk.ui.wizard.base import StepPage

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext
    from k3desk.ui.wizard.wizard import TierWizard


class DownloadPage(StepPage):
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
        # the set's projector: that it comes, and whether the engine release reads it
        self.projector = muted("")
        self.projector.setObjectName("downloadProjector")
        self.projector.setWordWrap(True)
        self.lay.addWidget(self.projector)
        # a download of hundreds of GiB takes hours: the engine step need not wait for it
        self.later = muted(
            "The download goes on in Downloads when you go on or close the wizard: "
            "set up the engine meanwhile, and launch once the files are verified."
        )
        self.later.setObjectName("downloadLater")
        self.later.setWordWrap(True)
        self.later.hide()
        self.lay.addWidget(self.later)
        self.panel = DownloadPanel(ctx)
        self.lay.addWidget(self.panel, 1)
        self.downloads = ctx.downloads
        self.start.clicked.connect(self.begin)
        self.have.clicked.connect(self._skip)
        # a bound method, not a lambda: Qt drops the connection with this page, so a
        # cancelled (deleted) wizard is never called by a later download
        self.downloads.changed.connect(self._changed)
        self._skipped = False

    def request(self) -> DownloadRequest | None:
        hub = self.wiz.hub_set()
        if hub is not None:
            return download_request_for(hub)
        tv = self.wiz.selected_tier()
        return DownloadRequest.from_tier(tv.tier) if tv is not None else None

    def initializePage(self) -> None:
        tv = self.wiz.selected_tier()
        hub = self.wiz.hub_set()
        if hub is not None:
            self.start.setText(
                f"Download {hub.remote.name} from {hub.repo} at {hub.revision[:7]}: "
                f"{hub.remote.count} parts, {fmt_bytes(hub.remote.total_bytes)}"
            )
            self.projector.setText(projector_note(hub.tier))
        elif tv is not None:
            self.start.setText(
                f"Download {tv.tier.name}: {tv.tier.shard_count} shards, "
                f"{fmt_bytes(tv.tier.size_bytes)}"
            )
            self.projector.setText(projector_note(tv.tier))
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

    def _changed(self, _state: object) -> None:
        self._refresh()

    def _refresh(self) -> None:
        running = self.downloads.running
        set_enabled(self.start, not running, "The download is running.")
        self.later.setVisible(running)
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        st = self.downloads.state
        # done, skipped, or running (it goes on in Downloads while the engine is set up)
        return self._skipped or self.downloads.running or (st is not None and st.status == "done")
