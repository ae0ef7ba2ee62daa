"""What every page of the app is given: the core services plus the UI's own shared objects.

Built once in :func:`k3desk.ui.main.create_context` and passed down through
constructors (no globals).  Long-lived UI controllers (the engine, downloads)
are built lazily on first use.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from k3desk.core.settings import Settings, SettingsStore
from k3desk.ui.errors import ErrorReporter
from k3desk.ui.tasks import TaskManager

if TYPE_CHECKING:
    from k3desk.app import Services
    from k3desk.core.hub.tokens import TokenStore
    from k3desk.ui.theme import ThemeManager


class AppContext(QObject):
    """Services, task manager, error reporter, settings and theme, shared by all pages.

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
        self.reporter = reporter
        self.store = store
        self._settings = settings
        self.theme = theme
        self.first_run = not store.exists
        self._controllers: dict[str, Any] = {}

    @cached_property
    def token_store(self) -> TokenStore:
        """The one Hugging Face token store (a session-only token lives in it)."""
        from k3desk.core.hub.tokens import TokenStore

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

    def controller(self, name: str) -> Any:
        """A lazily built, app-wide controller (``"engine"``, ``"downloads"``, ``"hardware"``,
        ``"cluster"``)."""
        if name not in self._controllers:
            self._controllers[name] = self._build(name)
        return self._controllers[name]

    def has_controller(self, name: str) -> bool:
        return name in self._controllers

    def _build(self, name: str) -> Any:
        if name == "hardware":
            from k3desk.ui.hardware import HardwareController

            return HardwareController(self, self)
        if name == "engine":
            from k3desk.ui.engine.controller import EngineController

            return EngineController(self, self)
        if name == "downloads":
            from k3desk.ui.downloads.controller import DownloadsController

            return DownloadsController(self, self)
        if name == "cluster":
            from k3desk.ui.cluster.controller import ClusterController

            return ClusterController(self, self)
        raise KeyError(name)

    def close(self) -> None:
        """Stop what the app started (engine, downloads) before exit."""
        if self.theme is not None:
            self.theme.close()
        for ctl in reversed(list(self._controllers.values())):
            close = getattr(ctl, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:  # noqa: BLE001 - shutting down: log and go on
                    self.reporter.show_dialogs = False
                    self.reporter.report(exc, "while closing")
        self._controllers.clear()
