"""The Downloads page: the current download, or what to do to start one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QVBoxLayout

from k3desk.ui.downloads.panel import DownloadPanel
from k3desk.ui.pages import Navigator, Page
from k3desk.ui.widgets import PageHeader

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext


class DownloadsPage(Page):
    def __init__(self, ctx: AppContext, window: Navigator | None = None) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(28, 22, 28, 16)
        lay.addWidget(
            PageHeader(
                "Downloads",
                "Shards come from the Hugging Face Hub, are checked against their published "
                "sha256, and resume where they stopped.",
            )
        )
        self.panel = DownloadPanel(ctx)
        lay.addWidget(self.panel, 1)
