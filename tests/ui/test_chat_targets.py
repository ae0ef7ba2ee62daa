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


def test_settings_send_remote_servers_to_the_attached_servers(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtWidgets import QLineEdit

    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    settings = w.show_page("settings")
    # one way to attach a server: no URL field of its own in Settings (the local API's web
    # origin names the pages allowed to read this machine's answers, not a server)
    fields = [
        e.placeholderText()
        for e in settings.findChildren(QLineEdit)
        if e.objectName() != "apiCorsOrigin"
    ]
    assert not [f for f in fields if "http" in f or "running server" in f], fields
    assert "attach one on the Cluster page" in settings.chat_target.text()
    settings.servers_btn.click()
    assert w.current_page() == "cluster"
    cluster = w.page("cluster")
    assert cluster.tabs.currentWidget() is cluster.servers


def make_context(services, qapp):  # type: ignore[no-untyped-def]
    from k3desk.ui.main import create_context

    context = create_context(services, qapp)
    context.reporter.show_dialogs = False
    return context


def close_context(context) -> None:  # type: ignore[no-untyped-def]
    context.close()
    context.tasks.shutdown(timeout=10)
    context.setParent(None)
    context.deleteLater()


def test_an_old_remote_server_setting_becomes_an_attached_server(qapp, qtbot, services) -> None:  # type: ignore[no-untyped-def]
    import json

    from k3desk.ui.chat.page import ChatPage

    url = "http://127.0.0.1:9/v1"
    file = services.paths.settings_file
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps({"remote_url": url, "wizard_done": True}))
    context = make_context(services, qapp)
    try:
        cluster = context.cluster
        engine = context.engine
        listed = cluster.endpoint_list()
        assert [(e.name, e.url) for e in listed] == [("remote", url)]
        qtbot.waitUntil(lambda: engine.chat_endpoint() is not None, timeout=5000)
        assert cluster.active_endpoint == "remote"
        saved = json.loads(file.read_text())
        assert saved["remote_url"] == ""  # moved, not kept in two places
        assert saved["recent"]["chat_endpoint"] == "remote"
        chat = ChatPage(context)
        qtbot.addWidget(chat)
        assert chat.status.text().startswith("Attached server remote")
        chat.composer.edit.setPlainText("hello")
        assert chat.composer.send_btn.isEnabled()
    finally:
        close_context(context)
    # a second start finds it attached once, and still in use
    context = make_context(services, qapp)
    try:
        engine = context.engine
        assert len(context.cluster.endpoint_list()) == 1
        qtbot.waitUntil(lambda: engine.chat_endpoint() is not None, timeout=5000)
    finally:
        close_context(context)


def test_a_remote_server_already_attached_is_not_attached_twice(qapp, qtbot, services) -> None:  # type: ignore[no-untyped-def]
    import json

    from k3desk.core.cluster.endpoints import EndpointStore

    url = "http://10.0.0.21:8008"
    EndpointStore(services.paths).add("vllm", url, check=False)
    file = services.paths.settings_file
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps({"remote_url": url + "/"}))
    context = make_context(services, qapp)
    try:
        cluster = context.cluster
        assert [e.name for e in cluster.endpoint_list()] == ["vllm"]
        qtbot.waitUntil(lambda: cluster.active_endpoint == "vllm", timeout=5000)
        assert context.settings.remote_url == ""
    finally:
        close_context(context)


def test_an_old_remote_server_that_is_not_a_url_is_reported(qapp, qtbot, services) -> None:  # type: ignore[no-untyped-def]
    import json

    file = services.paths.settings_file
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps({"remote_url": "my-box:8080"}))
    context = make_context(services, qapp)
    try:
        cluster = context.cluster
        assert cluster.endpoint_list() == []
        assert context.engine.chat_endpoint() is None
        message, hint, unexpected = context.reporter.last
        assert "'my-box:8080'" in message
        assert "is not an http(s) URL" in message
        assert "Cluster page" in hint
        assert not unexpected
    finally:
        close_context(context)
