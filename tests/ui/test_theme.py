"""The theme: one style for the application, and the colours following the system's
dark/light setting unless Settings names one."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPalette

from k3desk.ui import theme
from k3desk.ui.chat.view import MessageVM
from k3desk.ui.main import create_context
from k3desk.ui.theme import DARK, LIGHT
from k3desk.ui.window import MainWindow


def drawn_in(icon: QIcon) -> set[str]:
    """The colours of an icon's opaque pixels (line icons are drawn in one colour)."""
    img = icon.pixmap(QSize(24, 24)).toImage()
    colors = set()
    for x in range(img.width()):
        for y in range(img.height()):
            c = QColor.fromRgba(img.pixel(x, y))
            if c.alpha() == 255:
                colors.add(c.name())
    return colors


def test_another_context_leaves_the_style_of_an_open_wizard_alone(  # type: ignore[no-untyped-def]
    ctx, qtbot, qapp, services
) -> None:
    window = MainWindow(ctx)
    qtbot.addWidget(window)
    window.show()
    wiz = window.open_wizard()
    style = qapp.property("k3deskStyle")
    # each context applies the theme; replacing the style under an open QWizard crashed Qt
    for _ in range(2):
        other = create_context(services, qapp)
        other.close()
        other.tasks.shutdown(timeout=5)
        other.setParent(None)
        other.deleteLater()
    assert style == qapp.property("k3deskStyle") == "Fusion"
    assert wiz.isVisible()
    wiz.next()
    assert wiz.current_key() in ("machine", "tiers")


def test_the_theme_follows_the_system_scheme_unless_settings_name_one(ctx, qtbot, qapp) -> None:  # type: ignore[no-untyped-def]
    hints = QGuiApplication.styleHints()
    assert ctx.settings.theme == "system"
    window = MainWindow(ctx)
    qtbot.addWidget(window)
    window.show()
    chat = window.show_page("chat")
    chat.view.set_messages(
        [MessageVM("m1", "assistant", "Run it:\n\n```bash\nk3desk doctor --json\n```\n")]
    )
    # the platform reports the scheme through QStyleHints.colorSchemeChanged
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
    try:
        assert theme.current() is LIGHT
        assert drawn_in(window.sidebar.item(0).icon()) == {LIGHT.text}
        assert LIGHT.code_bg in chat.view.toHtml()

        hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
        assert theme.current() is DARK
        assert qapp.palette().color(QPalette.ColorRole.Window).name() == DARK.window
        assert qapp.palette().color(QPalette.ColorRole.Text).name() == DARK.text
        assert DARK.window in qapp.styleSheet()
        # line icons are drawn again in the dark theme's text colour
        for i in range(window.sidebar.count()):
            assert drawn_in(window.sidebar.item(i).icon()) == {DARK.text}
        assert drawn_in(chat.new_btn.icon()) == {DARK.text}
        assert drawn_in(chat.composer.attach.icon()) == {DARK.text}
        # the conversation is drawn again: dark code blocks, no light ones left
        html = chat.view.toHtml()
        assert DARK.code_bg in html
        assert LIGHT.code_bg not in html

        # a theme named in Settings wins over the system's
        ctx.update_settings(theme="light")
        assert theme.current() is LIGHT
        assert drawn_in(window.sidebar.item(0).icon()) == {LIGHT.text}
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
        assert theme.current() is LIGHT
        ctx.update_settings(theme="system")
        assert theme.current() is DARK  # the system is still dark
    finally:
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert theme.current() is LIGHT
