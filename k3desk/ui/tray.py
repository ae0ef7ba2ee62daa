"""The sign of an engine kept in the background: a tray icon with Open and Stop.

A window closed with "Keep it running" leaves a k3desk process without a window (see
:mod:`k3desk.core.app.background`).  Where the desktop has a system tray, that process
shows an icon there: its tooltip names the model and where it listens, "Open k3desk"
opens that process's window again (the one app of this person, see
:mod:`k3desk.ui.instance`: its engine, supervisor and conversation go on), and "Stop the
engine" quits the process, which stops the engine as any exit does.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from k3desk.ui import theme

OPEN_TEXT = "Open k3desk"
STOP_TEXT = "Stop the engine"


class KeeperTray(QObject):
    """The tray icon of a process keeping an engine without a window."""

    def __init__(
        self,
        model: str,
        url: str,
        stop: Callable[[], None],
        open_: Callable[[], None],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.stop = stop
        self.open = open_
        self.icon = QSystemTrayIcon(theme.app_icon(), self)
        self.icon.setToolTip(f"k3desk keeps {model} running at {url}")
        self.menu = QMenu()
        self.menu.addAction(OPEN_TEXT, lambda: self.open())
        self.menu.addSeparator()
        self.menu.addAction(STOP_TEXT, lambda: self.stop())
        self.icon.setContextMenu(self.menu)
        self.icon.activated.connect(self._activated)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (
            QSystemTrayIcon.ActivationReason.Trigger,
            QSystemTrayIcon.ActivationReason.DoubleClick,
        ):
            self.open()

    def actions(self) -> list[str]:
        return [a.text() for a in self.menu.actions() if a.text()]

    @classmethod
    def show_for(
        cls,
        model: str,
        url: str,
        stop: Callable[[], None],
        open_: Callable[[], None],
        parent: QObject | None = None,
    ) -> KeeperTray | None:
        """The icon, shown, where the desktop has a tray (None where it has none)."""
        if not QSystemTrayIcon.isSystemTrayAvailable():
            return None
        tray = cls(model, url, stop, open_, parent=parent)
        tray.icon.show()
        return tray
