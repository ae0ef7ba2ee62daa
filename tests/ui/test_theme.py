"""The theme: one style for the application, and the colours following the system's
dark/light setting unless Settings names one."""

from __future__ import annotations

from k3desk.ui.main import create_context
from k3desk.ui.window import MainWindow


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
        other.tasks.shutdown(timeout=5)
        other.setParent(None)
        other.deleteLater()
    assert style == qapp.property("k3deskStyle") == "Fusion"
    assert wiz.isVisible()
    wiz.next()
    assert wiz.current_key() in ("machine", "tiers")
