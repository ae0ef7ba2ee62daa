"""The main window: a sidebar (Chat, Models, Downloads, Engine, Settings, Cluster) and one page
at a time.

Pages are built the first time they are shown, which keeps start-up fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from PySide6.QtCore import QPoint, QSize, Qt, Signal
from PySide6.QtGui import (
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QKeySequence,
    QShortcut,
)
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from k3desk import __version__
from k3desk.ui import theme
from k3desk.ui.context import AppContext
from k3desk.ui.pages import Page, PageKey
from k3desk.ui.shortcuts import HELP_KEYS, ShortcutList
from k3desk.ui.widgets import fit_screen, label

if TYPE_CHECKING:
    from k3desk.ui.chat.page import ChatPage
    from k3desk.ui.cluster.page import ClusterPage
    from k3desk.ui.downloads.page import DownloadsPage
    from k3desk.ui.engine.page import EnginePage
    from k3desk.ui.models import ModelsPage
    from k3desk.ui.settings_page import SettingsPage
    from k3desk.ui.tray import KeeperTray
    from k3desk.ui.wizard.wizard import TierWizard

P = TypeVar("P", bound=Page)

GEOMETRY_KEY = "window_geometry"  # Settings.recent: where the window was, and its size
CloseChoice = str  # "keep" (the engine runs on in the background), "stop", "cancel"


def _chat(ctx: AppContext, window: MainWindow) -> Page:
    from k3desk.ui.chat.page import ChatPage

    return ChatPage(ctx, window)


def _models(ctx: AppContext, window: MainWindow) -> Page:
    from k3desk.ui.models import ModelsPage

    return ModelsPage(ctx, window)


def _downloads(ctx: AppContext, window: MainWindow) -> Page:
    from k3desk.ui.downloads.page import DownloadsPage

    return DownloadsPage(ctx, window)


def _engine(ctx: AppContext, window: MainWindow) -> Page:
    from k3desk.ui.engine.page import EnginePage

    return EnginePage(ctx, window)


def _settings(ctx: AppContext, window: MainWindow) -> Page:
    from k3desk.ui.settings_page import SettingsPage

    return SettingsPage(ctx, window)


def _cluster(ctx: AppContext, window: MainWindow) -> Page:
    from k3desk.ui.cluster.page import ClusterPage

    return ClusterPage(ctx, window)


@dataclass(frozen=True)
class PageSpec:
    key: PageKey
    title: str
    icon: str
    factory: Callable[[AppContext, MainWindow], Page]  # imports the page's module lazily
    tip: str


PAGES: tuple[PageSpec, ...] = (
    PageSpec(PageKey.CHAT, "Chat", "chat", _chat, "Talk to Kimi-K3"),
    PageSpec(
        PageKey.MODELS,
        "Models",
        "tiers",
        _models,
        "Quantization tiers and what fits this machine",
    ),
    PageSpec(
        PageKey.DOWNLOADS,
        "Downloads",
        "downloads",
        _downloads,
        "Shard downloads from the Hugging Face Hub",
    ),
    PageSpec(
        PageKey.ENGINE,
        "Engine",
        "engine",
        _engine,
        "llama-server: launch plan, state and log",
    ),
    PageSpec(
        PageKey.SETTINGS,
        "Settings",
        "settings",
        _settings,
        "Folders, engine, chat defaults, token, theme",
    ),
    PageSpec(
        PageKey.CLUSTER,
        "Cluster",
        "cluster",
        _cluster,
        "Several machines over SSH (SparkInfer, llama.cpp RPC) and attached servers",
    ),
)


class MainWindow(QMainWindow):
    """The window every page lives in; pages reach each other through it (a
    :class:`k3desk.ui.pages.Navigator`).

    Signals:
        page_changed(str): the key (a :class:`PageKey`) of the page now shown.
    """

    page_changed = Signal(str)

    def __init__(self, ctx: AppContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.setObjectName("mainWindow")
        self.setWindowTitle("k3desk")
        self.setWindowIcon(theme.app_icon())
        # within the screen's free area: a fixed 1280x800 puts the status bar below the
        # bottom of an 800-px-high screen
        room = fit_screen(self, 900, 600)  # the frame and title bar take some of it
        self.setMinimumSize(room)
        self.resize(fit_screen(self, 1280, 800))
        # what to do with a running engine on close; None: ask (tests and the automation
        # hook answer in advance)
        self.close_choice: CloseChoice | None = None
        self._closing = False
        self._quit_when_failed = False  # the engine kept without a window: quit if it fails
        self._pages: dict[PageKey, Page] = {}
        self._wizard: TierWizard | None = None
        self.tray: KeeperTray | None = None  # shown once the window closes, keeping the engine

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
        engine = ctx.engine
        engine.state_changed.connect(lambda _s, _m: self.set_engine_status(engine.state_text()))
        self.set_engine_status(engine.state_text())
        _ = ctx.cluster  # cluster engines and attached servers serve the chat too
        if "download" in ctx.settings.recent:
            _ = ctx.downloads  # an unfinished download continues at start-up

        self.sidebar.currentRowChanged.connect(self._row_changed)
        for i, spec in enumerate(PAGES):
            sc = QShortcut(QKeySequence(f"Ctrl+{i + 1}"), self)
            sc.activated.connect(self._goto(spec.key))
        for keys in HELP_KEYS:  # the list of shortcuts
            QShortcut(QKeySequence(keys), self).activated.connect(self.show_shortcuts)
        self.shortcut_list: ShortcutList | None = None
        if ctx.theme is not None:
            ctx.theme.changed.connect(self._theme_changed)
        self.setAcceptDrops(True)  # a .gguf file or a folder dropped anywhere: My models
        self._restore_geometry()
        # an engine an earlier k3desk kept running when its window closed
        engine.take_up_background()

    def _restore_geometry(self) -> None:
        """The size and place the window had when it closed (the place only if a screen
        still shows it: a monitor may have gone)."""
        saved = self.ctx.settings.recent.get(GEOMETRY_KEY)
        if not isinstance(saved, dict):
            return
        try:
            x, y, w, h = (int(saved[k]) for k in ("x", "y", "w", "h"))
        except (KeyError, TypeError, ValueError):
            return
        room = fit_screen(self, w, h)  # the screen may be smaller now
        w, h = room.width(), room.height()
        self.resize(max(w, self.minimumWidth()), max(h, self.minimumHeight()))
        if QGuiApplication.screenAt(QPoint(x + 40, y + 20)) is not None:
            self.move(x, y)
        if saved.get("maximized"):
            self.setWindowState(Qt.WindowState.WindowMaximized)

    def _save_geometry(self) -> None:
        g = self.normalGeometry() if self.isMaximized() else self.geometry()
        frame = self.frameGeometry()
        saved = {"x": frame.x(), "y": frame.y(), "w": g.width(), "h": g.height()}
        saved["maximized"] = self.isMaximized()
        self.ctx.remember(**{GEOMETRY_KEY: saved})

    # ------------------------------------------------------------- pages
    def _goto(self, key: PageKey) -> Callable[[], None]:
        def go() -> None:
            self.show_page(key)

        return go

    def page(self, key: PageKey | str) -> Page:
        """The page widget for ``key``, built on first use."""
        key = PageKey(key)
        if key not in self._pages:
            spec = next(s for s in PAGES if s.key == key)
            page = spec.factory(self.ctx, self)
            page.setObjectName(f"page-{key}")
            self._pages[key] = page
            self.stack.addWidget(page)
        return self._pages[key]

    def show_page(self, key: PageKey | str) -> Page:
        key = PageKey(key)
        row = next(i for i, s in enumerate(PAGES) if s.key == key)
        if self.sidebar.currentRow() != row:
            self.sidebar.setCurrentRow(row)  # -> _row_changed
        return self.page(key)

    def _typed(self, key: PageKey, cls: type[P]) -> P:
        page = self.page(key)
        if not isinstance(page, cls):  # a PAGES entry builds the wrong class
            raise TypeError(f"page {key} is a {type(page).__name__}, not a {cls.__name__}")
        return page

    def chat_page(self) -> ChatPage:
        from k3desk.ui.chat.page import ChatPage

        return self._typed(PageKey.CHAT, ChatPage)

    def models_page(self) -> ModelsPage:
        from k3desk.ui.models import ModelsPage

        return self._typed(PageKey.MODELS, ModelsPage)

    def downloads_page(self) -> DownloadsPage:
        from k3desk.ui.downloads.page import DownloadsPage

        return self._typed(PageKey.DOWNLOADS, DownloadsPage)

    def engine_page(self) -> EnginePage:
        from k3desk.ui.engine.page import EnginePage

        return self._typed(PageKey.ENGINE, EnginePage)

    def settings_page(self) -> SettingsPage:
        from k3desk.ui.settings_page import SettingsPage

        return self._typed(PageKey.SETTINGS, SettingsPage)

    def cluster_page(self) -> ClusterPage:
        from k3desk.ui.cluster.page import ClusterPage

        return self._typed(PageKey.CLUSTER, ClusterPage)

    def current_page(self) -> str:
        row = self.sidebar.currentRow()
        return PAGES[row].key.value if row >= 0 else ""

    def built_pages(self) -> list[str]:
        return [k.value for k in self._pages]

    def _row_changed(self, row: int) -> None:
        if row < 0:
            return
        key = PAGES[row].key
        page = self.page(key)
        self.stack.setCurrentWidget(page)
        page.activated()
        self.page_changed.emit(key.value)

    # ------------------------------------------------------------ wizard
    def open_wizard(self) -> TierWizard:
        """Open the tier-picker wizard (one at a time)."""
        from k3desk.ui.wizard.wizard import TierWizard

        if self._wizard is not None and self._wizard.isVisible():
            self._wizard.raise_()
            self._wizard.activateWindow()
            return self._wizard
        wizard = TierWizard(self.ctx, self)
        wizard.finished.connect(self._wizard_closed)
        wizard.have_files_chosen.connect(self._add_own_files)
        self._wizard = wizard
        wizard.open()
        return wizard

    @property
    def wizard(self) -> TierWizard | None:
        return self._wizard

    def _wizard_closed(self, _result: int) -> None:
        if self._wizard is not None:
            self._wizard.deleteLater()
        self._wizard = None

    def _add_own_files(self) -> None:
        """ "I already have the files" in the wizard: My models, and the file to add."""
        self.show_page(PageKey.MODELS)
        self.models_page().mine.choose_file()

    # ----------------------------------------------------- dropped models
    @staticmethod
    def _model_paths(event: QDragEnterEvent | QDropEvent) -> list[Path]:
        """The .gguf files and folders a drag carries (what "My models" takes)."""
        md = event.mimeData()
        if not md.hasUrls():
            return []
        paths = [Path(u.toLocalFile()) for u in md.urls() if u.isLocalFile()]
        return [p for p in paths if p.suffix.lower() == ".gguf" or p.is_dir()]

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if self._model_paths(event):
            event.acceptProposedAction()
        else:
            super().dragEnterEvent(event)

    def dropEvent(self, event: QDropEvent) -> None:
        paths = self._model_paths(event)
        if not paths:
            super().dropEvent(event)
            return
        event.acceptProposedAction()
        self.show_page(PageKey.MODELS)
        self.models_page().mine.add_paths(paths)

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

    def ask_close(self) -> CloseChoice:
        """Ask what becomes of the running engine: kept for the next start, or stopped."""
        engine = self.ctx.engine
        name = engine.model_name() or "The model"
        last = engine.last_model()
        load = last.load_text() if last is not None else ""
        again = f" Stopped, it {load} the next time." if load else ""
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("The engine is running")
        box.setText(f"{name} is loaded. Keep it running after k3desk closes?")
        box.setInformativeText(
            "Kept in the background, it goes on using its memory, and the next start of "
            f"k3desk continues with it at once.{again}"
        )
        keep = box.addButton("Keep it running", QMessageBox.ButtonRole.AcceptRole)
        stop = box.addButton("Stop the engine", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(keep)
        box.exec()
        clicked = box.clickedButton()
        return "keep" if clicked is keep else "stop" if clicked is stop else "cancel"

    def show_shortcuts(self) -> ShortcutList:
        """The keyboard shortcuts, listed (F1, Ctrl+/)."""
        if self.shortcut_list is None:
            self.shortcut_list = ShortcutList(self)
            self.shortcut_list.destroyed.connect(lambda: setattr(self, "shortcut_list", None))
        self.shortcut_list.show()
        self.shortcut_list.raise_()
        return self.shortcut_list

    def _show_tray(self, app: QApplication) -> None:
        """The windowless process's sign, where the desktop has a tray: Open, Stop."""
        from k3desk.ui.tray import KeeperTray

        engine = self.ctx.engine
        self.tray = KeeperTray.show_for(
            engine.model_name() or "the model",
            engine.address() or "",
            app.quit,
            parent=app,
            open_=self.bring_forward,
        )

    def _keeper_failed(self, _message: str, _hint: str) -> None:
        """The engine kept without a window gave up: nothing is left to keep."""
        app = QApplication.instance()
        if app is not None and not self.isVisible():
            app.quit()

    def bring_forward(self, page: str = "") -> None:
        """A second start (or the tray's Open) asks for the app: the window comes to the
        front, opened again when it was closed with the engine kept (this process, its
        supervisor and its conversation go on; nothing is taken up twice)."""
        if self._closing:
            self._reopen()
        if page and page in {p.key.value for p in PAGES}:
            self.show_page(page)
        self.setWindowState(
            (self.windowState() & ~Qt.WindowState.WindowMinimized) | Qt.WindowState.WindowActive
        )
        self.show()
        self.raise_()
        self.activateWindow()

    def _reopen(self) -> None:
        self._closing = False
        self.close_choice = None
        app = QApplication.instance()
        if isinstance(app, QApplication):
            app.setQuitOnLastWindowClosed(True)
        engine = self.ctx.engine_if_built
        if engine is not None:
            if self._quit_when_failed:
                self._quit_when_failed = False
                engine.failed.disconnect(self._keeper_failed)
            engine.stop_keeping()
        if self.tray is not None:
            self.tray.icon.hide()
            self.tray.deleteLater()
            self.tray = None
        for page in self._pages.values():
            page.reopening()

    def closeEvent(self, event: QCloseEvent) -> None:
        engine = self.ctx.engine_if_built
        if not self._closing and engine is not None and engine.local and engine.ready:
            choice = self.close_choice or self.ask_close()
            if choice == "cancel":
                event.ignore()
                return
            if choice == "keep" and engine.keep_in_background():
                app = QApplication.instance()
                if isinstance(app, QApplication) and engine.supervisor is not None:
                    app.setQuitOnLastWindowClosed(False)  # this process keeps the engine
                    # ... until it gives up (then there is nothing left to keep)
                    engine.failed.connect(self._keeper_failed)
                    self._quit_when_failed = True
                    self._show_tray(app)
            elif choice == "stop" and engine.background is not None:
                engine.stop_background_now()
        self._closing = True
        self._save_geometry()
        if self._wizard is not None:
            self._wizard.close()  # a wizard left open must not outlive the window
        for page in self._pages.values():
            page.closing()
        super().closeEvent(event)
