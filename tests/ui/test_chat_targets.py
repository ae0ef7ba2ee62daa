"""Where the chat sends its messages, and what it tells a person when it has nowhere to go."""

from __future__ import annotations

from PySide6.QtCore import QUrl

from k3desk.ui.window import MainWindow


def test_no_engine_points_to_the_engine_and_cluster_pages(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    chat = w.show_page("chat")
    tip = chat.composer.send_btn.toolTip()
    assert "Engine page" in tip
    assert "Cluster page" in tip
    assert "attach a remote server" in tip
    assert "Settings" not in tip  # remote servers are attached on the Cluster page only
    assert "Cluster page" in chat.view.toPlainText()
    # the empty conversation offers both pages as links that open them
    html = chat.view.toHtml()
    assert "k3:page/cluster/0" in html
    assert "k3:page/engine/0" in html
    chat.view._anchor(QUrl("k3:page/cluster/0"))  # what a click on the link does
    assert w.current_page() == "cluster"
    w.show_page("chat")
    chat.view._anchor(QUrl("k3:page/engine/0"))
    assert w.current_page() == "engine"
