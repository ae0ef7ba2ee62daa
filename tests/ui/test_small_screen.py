"""At 1024x700 (a small laptop screen) nothing the person needs is cut off or off-screen."""

from __future__ import annotations

from PySide6.QtGui import QGuiApplication

from k3desk.ui.window import MainWindow


def test_the_composer_hint_wraps_instead_of_being_cut(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.resize(1024, 700)
    w.show()
    qtbot.waitExposed(w)
    chat = w.chat_page()
    hint = chat.composer.hint
    qtbot.waitUntil(lambda: bool(hint.text()), timeout=2000)
    assert "Cluster page (Ctrl+6)" in hint.text()  # the whole reason, to its end
    qtbot.wait(50)
    if not hint.wordWrap():
        assert hint.sizeHint().width() <= hint.width()  # one line, and it fits
    else:
        assert hint.height() >= hint.heightForWidth(hint.width())  # every line shown
    assert hint.geometry().right() <= chat.composer.width()


def test_the_wizard_opens_inside_the_screen(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    wizard = w.open_wizard()
    free = (wizard.screen() or QGuiApplication.primaryScreen()).availableGeometry()
    assert wizard.width() <= max(free.width(), wizard.minimumSizeHint().width())
    assert wizard.height() <= max(free.height(), wizard.minimumSizeHint().height())
    wizard.reject()


def test_every_models_column_is_on_screen_at_1024(ctx, qtbot, hardware_file) -> None:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.resize(1024, 700)
    w.show()
    ctx.hardware.load_file(hardware_file("8xH100-2TB"))
    page = w.models_page()
    w.show_page("models")
    table = page.table
    qtbot.waitUntil(lambda: table.rowCount() > 0, timeout=60_000)
    qtbot.wait(50)
    h = table.horizontalHeader()
    shown = sum(h.sectionSize(i) for i in range(table.columnCount()))
    assert shown <= table.viewport().width()  # no column behind a horizontal scroll
    assert not table.horizontalScrollBar().isVisible()
    assert all(h.sectionSize(i) > 30 for i in range(table.columnCount()))
