"""The wizard in the first minute: a cancelled wizard leaves nothing connected behind, and a
long download does not hold the wizard hostage."""

from __future__ import annotations

import gc

import pytest
from PySide6.QtCore import QCoreApplication, QEvent
from PySide6.QtWidgets import QWizard

from k3desk.ui.window import MainWindow


@pytest.fixture
def window(ctx, qtbot, tier_repo):  # type: ignore[no-untyped-def]
    from k3desk.core.hub.tokens import TokenStore

    ctx.__dict__["token_store"] = TokenStore(env={})  # no token from the real environment
    ctx.downloads.endpoint = tier_repo.hub.endpoint
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    return w


def test_a_cancelled_wizard_is_not_touched_by_a_later_download(  # type: ignore[no-untyped-def]
    window, qtbot, tier_repo, tmp_path
) -> None:
    # D1: Models -> "Download and run a tier..." -> Cancel; later a download starts
    # and resumes on the Downloads page: nothing of the closed wizard may answer it
    errors: list[str] = []
    window.ctx.reporter.reported.connect(lambda m, _h, _u: errors.append(m))
    wiz = window.open_wizard()
    qtbot.waitUntil(lambda: wiz.isVisible(), timeout=10_000)
    wiz.reject()
    qtbot.waitUntil(lambda: window.wizard is None, timeout=10_000)
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()
    tier_repo.hub.throttle_bps = 4_000_000
    dl = window.ctx.downloads
    dl.start(tier_repo.request(), tmp_path / "models")
    qtbot.waitUntil(lambda: dl.state is not None and dl.state.done > 1_000_000, timeout=30_000)
    dl.pause()
    qtbot.waitUntil(lambda: dl.state.status == "paused", timeout=30_000)
    tier_repo.hub.throttle_bps = 0
    dl.resume()
    qtbot.waitUntil(lambda: dl.state.status == "done", timeout=60_000)
    assert errors == []


def test_next_is_open_while_the_download_runs(  # type: ignore[no-untyped-def]
    window, qtbot, tier_repo, tmp_path, hardware_file
) -> None:
    # D13: a 307 GiB download takes hours; the engine step can be set up meanwhile and
    # the download goes on in Downloads
    from tests.ui.test_wizard import open_wizard_for

    window.ctx.update_settings(download_dir=str(tmp_path / "models"))
    wiz = open_wizard_for(window, qtbot, hardware_file("no-gpu-laptop-32GB"))
    wiz.setCurrentId(4)  # the download step
    assert wiz.current_key() == "download"
    nxt = wiz.button(QWizard.WizardButton.NextButton)
    assert not nxt.isEnabled()  # nothing started yet: Start or "I already have these files"
    tier_repo.hub.throttle_bps = 2_000_000
    dl = window.ctx.downloads
    dl.start(tier_repo.request(), tmp_path / "models")
    qtbot.waitUntil(lambda: dl.running, timeout=10_000)
    qtbot.waitUntil(lambda: nxt.isEnabled(), timeout=10_000)
    assert "Downloads" in wiz.download.later.text()
    assert wiz.download.later.isVisible()
    wiz.next()
    assert wiz.current_key() == "engine"
    assert dl.running  # the download goes on
    # the engine step offers the engine one has, beside building one
    choose = wiz.engine.panel.choose
    assert choose.isVisible()
    assert choose.text() == "Choose llama-server…"
    assert wiz.engine.panel.build.isVisible()
    dl.cancel()
    qtbot.waitUntil(lambda: not dl.running, timeout=30_000)
