"""A download survives closing the app: the next start shows it and resumes it, unless the
user had paused it (then it waits, paused) or cancelled it (then it is gone)."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication

from k3desk.ui.downloads.panel import DownloadPanel
from k3desk.ui.window import MainWindow


@pytest.fixture
def hub(ctx, tier_repo, monkeypatch):  # type: ignore[no-untyped-def]
    from k3desk.core.hub.tokens import TokenStore

    monkeypatch.setenv("HF_ENDPOINT", tier_repo.hub.endpoint)  # the next start's too
    ctx.__dict__["token_store"] = TokenStore(env={})
    return tier_repo


def restart(qtbot, services):  # type: ignore[no-untyped-def]
    """A new app on the same K3DESK_HOME, with its main window."""
    from k3desk.core.hub.tokens import TokenStore
    from k3desk.ui.main import create_context

    ctx2 = create_context(services, QApplication.instance())
    ctx2.reporter.show_dialogs = False
    ctx2.__dict__["token_store"] = TokenStore(env={})
    w = MainWindow(ctx2)
    qtbot.addWidget(w)
    return ctx2, w


def stop(ctx2) -> None:  # type: ignore[no-untyped-def]
    ctx2.close()
    ctx2.tasks.shutdown(timeout=10)


def start_slowly(ctx, qtbot, hub, target):  # type: ignore[no-untyped-def]
    hub.hub.throttle_bps = 4_000_000
    dl = ctx.downloads
    dl.start(hub.request(), target)
    qtbot.waitUntil(lambda: dl.state.done > 1_000_000, timeout=30_000)
    return dl


def test_closing_the_app_mid_download_resumes_it_at_the_next_start(  # type: ignore[no-untyped-def]
    ctx, qtbot, hub, services, tmp_path
) -> None:
    target = tmp_path / "models"
    dl = start_slowly(ctx, qtbot, hub, target)
    ctx.close()  # what quitting the app does
    qtbot.waitUntil(lambda: dl.state.status == "paused", timeout=30_000)
    sent_before = hub.hub.bytes_sent()
    hub.hub.throttle_bps = 0
    ctx2, _window = restart(qtbot, services)
    try:
        assert ctx2.downloads_if_built is not None  # started with the window, no page visited
        dl2 = ctx2.downloads
        assert dl2.state is not None
        assert dl2.state.target == target
        assert dl2.state.request == hub.request()
        qtbot.waitUntil(lambda: dl2.state.status == "done", timeout=60_000)
        for path, data in hub.wanted.items():
            assert (target / path).read_bytes() == data
        total = sum(len(d) for d in hub.wanted.values())
        assert hub.hub.bytes_sent() - sent_before < total  # continued, not started over
        assert "download" not in ctx2.settings.recent  # finished: nothing to resume any more
    finally:
        stop(ctx2)


def test_a_download_the_user_paused_stays_paused_after_a_restart(  # type: ignore[no-untyped-def]
    ctx, qtbot, hub, services, tmp_path
) -> None:
    dl = start_slowly(ctx, qtbot, hub, tmp_path / "models")
    dl.pause()
    qtbot.waitUntil(lambda: dl.state.status == "paused", timeout=30_000)
    ctx.close()
    ctx2, _window = restart(qtbot, services)
    try:
        dl2 = ctx2.downloads
        assert dl2.state is not None
        assert dl2.state.status == "paused"
        qtbot.wait(300)
        assert not dl2.running  # not resumed behind the user's back
        panel = DownloadPanel(ctx2)
        qtbot.addWidget(panel)
        assert panel.resume_btn.isEnabled()
        assert "paused" in panel.title.text()
    finally:
        stop(ctx2)


def test_a_cancelled_download_is_not_shown_after_a_restart(  # type: ignore[no-untyped-def]
    ctx, qtbot, hub, services, tmp_path
) -> None:
    dl = start_slowly(ctx, qtbot, hub, tmp_path / "models")
    dl.cancel()
    qtbot.waitUntil(lambda: dl.state.status == "cancelled", timeout=30_000)
    ctx.close()
    ctx2, _window = restart(qtbot, services)
    try:
        assert ctx2.downloads.state is None
    finally:
        stop(ctx2)
