"""The tray's "Open k3desk" of an app kept running without a window opens that app's own
window again: the same process, the same supervisor and engine, no second app and no
engine taken up twice; closed again with the engine kept, it keeps it again."""

from __future__ import annotations

import pytest

from k3desk.core.app import background
from k3desk.ui.window import MainWindow

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_open_in_the_tray_reopens_this_apps_window(  # type: ignore[no-untyped-def]
    ctx, qtbot, launch_engine, llama_server, tiny_k3_single, monkeypatch
) -> None:
    from PySide6.QtWidgets import QApplication, QSystemTrayIcon

    engine = launch_engine(llama_server, tiny_k3_single, vision=False)
    supervisor, pid = engine.supervisor, engine.endpoint().pid
    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: True))
    app = QApplication.instance()
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    paths = ctx.services.paths
    try:
        for _ in range(2):
            w.close_choice = "keep"
            w.close()
            assert not w.isVisible()
            assert w.tray is not None
            assert app.quitOnLastWindowClosed() is False
            assert background.kept(paths) is not None
            w.tray.open()  # "Open k3desk" (or a click on the icon)
            assert w.isVisible()
            assert w.tray is None
            assert app.quitOnLastWindowClosed() is True
            assert background.kept(paths) is None  # this window's engine again
            assert engine.supervisor is supervisor
            assert engine.ready
            assert engine.endpoint().pid == pid
            assert engine.background is None
        assert ctx.reporter.last is None
    finally:
        app.setQuitOnLastWindowClosed(True)
        if w.tray is not None:
            w.tray.icon.hide()
        engine.stop()
