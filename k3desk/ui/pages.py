"""The main window's pages: their keys, the base every page widget derives from, and the
navigator a page moves through.

Pages never look their window up by name: each is given a :class:`Navigator` (the main
window, or None when it is embedded elsewhere) and calls it through its typed methods.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from PySide6.QtWidgets import QWidget

if TYPE_CHECKING:
    from k3desk.ui.chat.page import ChatPage
    from k3desk.ui.cluster.page import ClusterPage
    from k3desk.ui.downloads.page import DownloadsPage
    from k3desk.ui.engine.page import EnginePage
    from k3desk.ui.models import ModelsPage
    from k3desk.ui.settings_page import SettingsPage


class PageKey(StrEnum):
    """The pages, in sidebar order (Ctrl+1 .. Ctrl+6)."""

    CHAT = "chat"
    MODELS = "models"
    DOWNLOADS = "downloads"
    ENGINE = "engine"
    SETTINGS = "settings"
    CLUSTER = "cluster"


class Page(QWidget):
    """A page of the main window.  :meth:`activated` runs each time it is shown,
    :meth:`closing` once when the window closes (and :meth:`reopening` when a window closed
    with the engine kept is opened again)."""

    def activated(self) -> None:
        """Shown (again): refresh what may have changed meanwhile."""

    def closing(self) -> None:
        """The window is closing: let go of what the page holds."""

    def reopening(self) -> None:
        """The window closed with the engine kept opens again in the same process: take
        up again what :meth:`closing` let go of."""


class Navigator(Protocol):
    """What a page may ask of the window it lives in."""

    def show_page(self, key: PageKey) -> Page: ...

    def open_wizard(self) -> QWidget: ...

    def chat_page(self) -> ChatPage: ...

    def models_page(self) -> ModelsPage: ...

    def downloads_page(self) -> DownloadsPage: ...

    def engine_page(self) -> EnginePage: ...

    def settings_page(self) -> SettingsPage: ...

    def cluster_page(self) -> ClusterPage: ...
