"""What every page of the app is given: the core services plus the UI's own shared objects.

Built once in :func:`k3desk.ui.main.create_context` and passed down through
constructors (no globals).  The long-lived UI controllers (:attr:`AppContext.hardware`,
:attr:`~AppContext.engine`, :attr:`~AppContext.downloads`, :attr:`~AppContext.cluster`)
are typed attributes, each built on first use and closed, newest first, with the app.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QObject, Signal

from k3desk.core.app.values import Settings, SettingsStore
from k3desk.ui.errors import ErrorReporter
from k3desk.ui.operations import OperationRunner
from k3desk.ui.tasks import TaskManager

if TYPE_CHECKING:
    from k3desk.core.app.downloads import TokenStore
    from k3desk.core.app.services import Services
    from k3desk.ui.cluster.controller import ClusterController
    from k3desk.ui.downloads.controller import DownloadsController
    from k3desk.ui.engine.controller import EngineController
    from k3desk.ui.hardware import HardwareController
    from k3desk.ui.theme import ThemeManager


log = logging.getLogger(__name__)


class _Closable(Protocol):
    def close(self) -> None: ...


class AppContext(QObject):
    """Services, task manager, operation runner, error reporter, settings and theme,
    shared by all pages.

    Signals:
        settings_changed(object): the new :class:`Settings` after a save.
    """

    settings_changed = Signal(object)

    def __init__(
        self,
        services: Services,
        tasks: TaskManager,
        reporter: ErrorReporter,
        store: SettingsStore,
        settings: Settings,
        theme: ThemeManager | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.services = services
        self.tasks = tasks
        self.ops = OperationRunner(tasks, self)  # user actions, and what they changed
        self.reporter = reporter
        self.store = store
        self._settings = settings
        self.theme = theme
        self.first_run = not store.exists
        self.settings_unreadable = False  # set when the file exists but could not be read
        self._built: list[_Closable] = []  # the controllers built so far, oldest first
        self._hardware: HardwareController | None = None
        self._engine: EngineController | None = None
        self._downloads: DownloadsController | None = None
        self._cluster: ClusterController | None = None

    @cached_property
    def token_store(self) -> TokenStore:
        """The one Hugging Face token store (a session-only token lives in it)."""
        from k3desk.core.app.downloads import TokenStore

        return TokenStore()

    @property
    def settings(self) -> Settings:
        return self._settings

    def save_settings(self, settings: Settings) -> None:
        """Validate, write and announce ``settings`` (raises K3Error when invalid)."""
        self.store.save(settings)
        old = self._settings
        self._settings = settings
        if self.theme is not None and settings.theme != old.theme:
            self.theme.apply(settings.theme)
        self.settings_changed.emit(settings)

    def update_settings(self, **changes: Any) -> None:
        self.save_settings(dataclasses.replace(self._settings, **changes))

    def remember(self, **recent: Any) -> None:
        """Keep small facts of this session in ``Settings.recent`` (a value of None drops
        its key): only where the settings file is already there and was read, so a first
        run writes none (the wizard opens next time too) and an unreadable file is never
        overwritten behind the person's back.  A failed write is logged, not shown."""
        if not self.store.exists or self.settings_unreadable:
            return
        new = {k: v for k, v in {**self._settings.recent, **recent}.items() if v is not None}
        if new == self._settings.recent:
            return
        try:
            self.update_settings(recent=new)
        except Exception as exc:  # noqa: BLE001 - a convenience: say it in the log only
            log.warning("could not remember %s: %s", ", ".join(recent), exc)

    # ------------------------------------------------------- controllers
    @property
    def hardware(self) -> HardwareController:
        """The machine the pages judge tiers for, and this machine (what launches plan for)."""
        if self._hardware is None:
            from k3desk.ui.hardware import HardwareController

            self._hardware = HardwareController(self, self)
            self._built.append(self._hardware)
        return self._hardware

    @property
    def engine(self) -> EngineController:
        """The local llama-server (and where the chat goes)."""
        if self._engine is None:
            from k3desk.ui.engine.controller import EngineController

            self._engine = EngineController(self, self)
            self._built.append(self._engine)
        return self._engine

    @property
    def downloads(self) -> DownloadsController:
        if self._downloads is None:
            from k3desk.ui.downloads.controller import DownloadsController

            self._downloads = DownloadsController(self, self)
            self._built.append(self._downloads)
        return self._downloads

    @property
    def cluster(self) -> ClusterController:
        """Clusters, cluster engines and attached servers."""
        if self._cluster is None:
            from k3desk.ui.cluster.controller import ClusterController

            self._cluster = ClusterController(self, self)
            self._built.append(self._cluster)
        return self._cluster

    @property
    def engine_if_built(self) -> EngineController | None:
        """The engine controller, without building it."""
        return self._engine

    @property
    def downloads_if_built(self) -> DownloadsController | None:
        """The downloads controller, without building it."""
        return self._downloads

    def close(self) -> None:
        """Stop what the app started (engine, downloads) before exit."""
        if self.theme is not None:
            self.theme.close()
        for ctl in reversed(self._built):
            try:
                ctl.close()
            except Exception as exc:  # noqa: BLE001 - shutting down: log and go on
                self.reporter.show_dialogs = False
                self.reporter.report(exc, "while closing")
        self._built.clear()
        self._hardware = self._engine = self._downloads = self._cluster = None
