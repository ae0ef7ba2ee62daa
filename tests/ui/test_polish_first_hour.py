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
    assert w.width() <= free.width()
    assert w.height() <= free.height()
    bar = w.statusBar()
    assert bar.isVisible()
    assert bar.geometry().bottom() < w.height()


def test_a_size_saved_on_a_larger_screen_is_fitted(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    ctx.remember(**{GEOMETRY_KEY: {"x": 0, "y": 0, "w": 1900, "h": 1150, "maximized": False}})
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    free = _free(w)
    assert w.width() <= free.width()
    assert w.height() <= free.height()


def test_an_answer_that_is_only_reasoning_shows_it(qapp, qtbot) -> None:  # type: ignore[no-untyped-def]
    """D18: the body was empty and the heading said "Reasoning (1 words)"."""
    from k3desk.ui.chat.view import MessageView, MessageVM

    view = MessageView()
    qtbot.addWidget(view)
    view.set_messages(
        [
            MessageVM("1", "user", "Why?"),
            MessageVM("2", "assistant", "", reasoning="Because"),
        ]
    )
    text = view.toPlainText()
    assert "Reasoning (1 word)" in text
    assert "words" not in text
    assert "Because" in text  # shown without a click: it is all there is
    assert "wrote no answer" in text
    # and one with an answer keeps its reasoning folded
    view.set_messages([MessageVM("3", "assistant", "Yes.", reasoning="Because of two things")])
    assert "Because of" not in view.toPlainText()
    assert "Reasoning (4 words)" in view.toPlainText()


def test_copy_says_copied(qapp, qtbot) -> None:  # type: ignore[no-untyped-def]
    """D23: Copy copied without a word."""
    from PySide6.QtCore import QUrl
    from PySide6.QtWidgets import QToolTip

    from k3desk.ui.chat.view import MessageView, MessageVM

    view = MessageView()
    qtbot.addWidget(view)
    view.show()
    view.set_messages([MessageVM("2", "assistant", "Use `-c 8192`:\n\n```bash\nk3desk serve\n```")])
    view.anchorClicked.emit(QUrl("k3:copy/2/0"))
    assert QGuiApplication.clipboard().text().startswith("Use")
    qtbot.waitUntil(QToolTip.isVisible, timeout=2000)
    assert QToolTip.text() == "Copied"
    view.anchorClicked.emit(QUrl("k3:copy-code/2/0"))
    assert QGuiApplication.clipboard().text() == "k3desk serve"
    assert QToolTip.text() == "Copied the code"
