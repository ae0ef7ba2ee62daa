"""The first hour, polished: what a newcomer met on a real screen (issue 25's D-items)."""

from __future__ import annotations

from PySide6.QtGui import QGuiApplication

from k3desk.ui.window import GEOMETRY_KEY, MainWindow


def _free(widget):  # type: ignore[no-untyped-def]
    return (widget.screen() or QGuiApplication.primaryScreen()).availableGeometry()


def test_the_window_opens_within_the_screen(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    """D7: the offscreen screen is 800x800; a fixed 1280x800 hid the status bar."""
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    free = _free(w)
    assert free.width() < 1280  # the small screen this test is about
    assert w.width() <= free.width() and w.height() <= free.height()
    bar = w.statusBar()
    assert bar.isVisible() and bar.geometry().bottom() < w.height()


def test_a_size_saved_on_a_larger_screen_is_fitted(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    ctx.remember(**{GEOMETRY_KEY: {"x": 0, "y": 0, "w": 1900, "h": 1150, "maximized": False}})
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    free = _free(w)
    assert w.width() <= free.width() and w.height() <= free.height()
