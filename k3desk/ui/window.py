"""The main window: a sidebar (Chat, Models, Downloads, Engine, Settings, Cluster) and one page
at a time.

Pages are built the first time they are shown, which keeps start-up fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from k3desk import __version__
from k3desk.ui import theme
from k3desk.ui.context import AppContext
from k3desk.ui.widgets import label


@dataclass(frozen=True)
class PageSpec:
    key: str
    title: str
    icon: str
    factory: str  # "module:Class", built with (ctx, window)
    tip: str


PAGES: tuple[PageSpec, ...] = (
    PageSpec("chat", "Chat", "chat", "k3desk.ui.chat.page:ChatPage", "Talk to Kimi-K3"),
    PageSpec(
        "models",
        "Models",
        "tiers",
        "k3desk.ui.models:ModelsPage",
        "Quantization tiers and what fits this machine",
    ),
    PageSpec(
        "downloads",
        "Downloads",
        "downloads",
        "k3desk.ui.downloads.page:DownloadsPage",
        "Shard downloads from the Hugging Face Hub",
    ),
    PageSpec(
        "engine",
        "Engine",
        "engine",
        "k3desk.ui.engine.page:EnginePage",
        "llama-server: launch plan, state and log",
    ),
    PageSpec(
        "settings",
        "Settings",
        "settings",
        "k3desk.ui.settings_page:SettingsPage",
        "Folders, engine, chat defaults, token, theme",
    ),
    PageSpec(
        "cluster",
        "Cluster",
        "cluster",
        "k3desk.ui.cluster.page:ClusterPage",
        "Several machines over SSH (SparkInfer, llama.cpp RPC) and attached servers",
    ),
)


class MainWindow(QMainWindow):
    """Signals:
    page_changed(str): the key of the page now shown.
    """

    page_changed = Signal(str)

    def __init__(self, ctx: AppContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.setObjectName("mainWindow")
        self.setWindowTitle("k3desk")
        self.setWindowIcon(theme.app_icon())
        self.resize(1280, 800)
        self.setMinimumSize(QSize(900, 600))
        self._pages: dict[str, QWidget] = {}
        self._wizard: QWidget | None = None

        central = QWidget()
        root = QHBoxLayout(central)
        root.setContentsMargins(0, 0, 0, 0)
        root.setSpacing(0)

        side = QWidget()
        side.setObjectName("sideColumn")
        side.setFixedWidth(196)
        side_lay = QVBoxLayout(side)
        side_lay.setContentsMargins(0, 0, 0, 0)
        side_lay.setSpacing(0)
        brand = label("k3desk", "brand", wrap=False)
        side_lay.addWidget(brand)
        side_lay.addWidget(label("Kimi-K3 on your machine", "brandSub"))
        self.sidebar = QListWidget()
        self.sidebar.setObjectName("sidebar")
        self.sidebar.setIconSize(QSize(20, 20))
        self.sidebar.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        for spec in PAGES:
            item = QListWidgetItem(theme.icon(spec.icon), spec.title)
            item.setData(Qt.ItemDataRole.UserRole, spec.key)
            item.setToolTip(spec.tip)
            self.sidebar.addItem(item)
        side_lay.addWidget(self.sidebar, 1)
        self.version_label = label(f"version {__version__}", "brandSub")
        side_lay.addWidget(self.version_label)
        side.setStyleSheet("")
        root.addWidget(side)

        self.stack = QStackedWidget()
        root.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        self.status_engine = QLabel("Engine: not running")
        self.status_engine.setObjectName("statusEngine")
        self.status_tasks = QLabel("")
        self.statusBar().addPermanentWidget(self.status_tasks)
        self.statusBar().addPermanentWidget(self.status_engine)
        ctx.tasks.busy_changed.connect(self._busy)
        engine = ctx.controller("engine")
        engine.state_changed.connect(lambda _s, _m: self.set_engine_status(engine.state_text()))
        self.set_engine_status(engine.state_text())
        ctx.controller("cluster")  # cluster engines and attached servers serve the chat too
        if "download" in ctx.settings.recent:
            ctx.controller("downloads")  # an unfinished download continues at start-up

        self.sidebar.currentRowChanged.connect(self._row_changed)
        for i, spec in enumerate(PAGES):
            sc = QShortcut(QKeySequence(f"Ctrl+{i + 1}"), self)
            sc.activated.connect(self._goto(spec.key))
        if ctx.theme is not None:
            ctx.theme.changed.connect(self._theme_changed)

    # ------------------------------------------------------------- pages
    def _goto(self, key: str) -> Callable[[], None]:
        def go() -> None:
            self.show_page(key)

        return go

    def page(self, key: str) -> QWidget:
        """The page widget for ``key``, built on first use."""
        if key not in self._pages:
            spec = next(s for s in PAGES if s.key == key)
            module, cls = spec.factory.split(":")
            page: QWidget = getattr(importlib.import_module(module), cls)(self.ctx, self)
            page.setObjectName(f"page-{key}")
            self._pages[key] = page
            self.stack.addWidget(page)
        return self._pages[key]

    def show_page(self, key: str) -> QWidget:
        row = next(i for i, s in enumerate(PAGES) if s.key == key)
        if self.sidebar.currentRow() != row:
            self.sidebar.setCurrentRow(row)  # -> _row_changed
        return self._pages[key]

    def current_page(self) -> str:
        row = self.sidebar.currentRow()
        return PAGES[row].key if row >= 0 else ""

    def built_pages(self) -> list[str]:
        return list(self._pages)

    def _row_changed(self, row: int) -> None:
        if row < 0:
            return
        key = PAGES[row].key
        page = self.page(key)
        self.stack.setCurrentWidget(page)
        activated = getattr(page, "activated", None)
        if activated is not None:
            activated()
        self.page_changed.emit(key)

    # ------------------------------------------------------------ wizard
    def open_wizard(self) -> QWidget:
        """Open the tier-picker wizard (one at a time)."""
        from k3desk.ui.wizard.wizard import TierWizard

        if self._wizard is not None and self._wizard.isVisible():
            self._wizard.raise_()
            self._wizard.activateWindow()
            return self._wizard
        wizard = TierWizard(self.ctx, self)
        wizard.finished.connect(self._wizard_closed)
        self._wizard = wizard
        wizard.open()
        return wizard

    @property
    def wizard(self) -> QWidget | None:
        return self._wizard

    def _wizard_closed(self, _result: int) -> None:
        if self._wizard is not None:
            self._wizard.deleteLater()
        self._wizard = None

    # -------------------------------------------------------------- misc
    def set_engine_status(self, text: str) -> None:
        self.status_engine.setText(text)

    def _busy(self, n: int) -> None:
        self.status_tasks.setText(f"{n} task{'s' if n != 1 else ''} running" if n else "")

    def _theme_changed(self, _colors: object) -> None:
        for i, spec in enumerate(PAGES):
            item = self.sidebar.item(i)
            if item is not None:
                item.setIcon(theme.icon(spec.icon))

    def closeEvent(self, event: QCloseEvent) -> None:
        if self._wizard is not None:
            self._wizard.close()  # a wizard left open must not outlive the window
        for page in self._pages.values():
            closing = getattr(page, "closing", None)
            if closing is not None:
                closing()
        super().closeEvent(event)
