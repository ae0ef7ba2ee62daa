"""A stopped download after a restart: failed stays failed with its reason and its bytes
(D8); a paused or failed one can be discarded (D9); a disabled red button looks disabled."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QMessageBox

from k3desk.core.hub.state import meta_dir
from k3desk.core.units import fmt_bytes
from k3desk.ui.downloads.panel import DownloadPanel
from tests.ui.test_download_restart import restart, start_slowly, stop


@pytest.fixture
def hub(ctx, tier_repo, monkeypatch):  # type: ignore[no-untyped-def]
    from k3desk.core.hub.tokens import TokenStore

    monkeypatch.setenv("HF_ENDPOINT", tier_repo.hub.endpoint)
    ctx.__dict__["token_store"] = TokenStore(env={})
    return tier_repo


def partials(target) -> list:  # type: ignore[no-untyped-def]
    root = meta_dir(target) / "partial"
    return [p for p in root.rglob("*.k3part")] if root.is_dir() else []


def test_a_failed_download_is_shown_failed_after_a_restart_and_can_be_discarded(  # type: ignore[no-untyped-def]
    ctx, qtbot, hub, services, tmp_path, monkeypatch
) -> None:
    target = tmp_path / "models"
    last = sorted(hub.wanted)[-1]
    hub.hub.fail_next(last, 403)  # refused: not retried
    dl = start_slowly(ctx, qtbot, hub, target)
    qtbot.waitUntil(lambda: dl.state.status == "failed", timeout=60_000)
    error, total = dl.state.error, dl.state.total
    assert error
    assert total > 0
    ctx.close()
    ctx2, _window = restart(qtbot, services)
    try:
        dl2 = ctx2.downloads
        assert dl2.state.status == "failed"  # not "paused"
        assert dl2.state.error == error  # the reason kept
        panel = DownloadPanel(ctx2)
        qtbot.addWidget(panel)
        assert "failed" in panel.title.text()
        assert f"of {fmt_bytes(total)}" in panel.numbers.text()  # not "0 B of 0 B"
        assert "0 B of 0 B" not in panel.numbers.text()
        assert error[:40] in panel.banner.text.text()
        assert panel.resume_btn.isEnabled()
        # D9: it can be discarded
        assert panel.cancel_btn.isEnabled()
        assert panel.cancel_btn.text() == "Discard"
        asked: list[str] = []

        def yes(*a, **_k):  # type: ignore[no-untyped-def]
            asked.append(a[2])
            return QMessageBox.StandardButton.Yes

        monkeypatch.setattr(QMessageBox, "question", yes)
        panel.cancel_btn.click()
        assert asked  # asked first
        assert dl2.state.status == "cancelled"
        assert not partials(target)
        assert "download" not in ctx2.settings.recent
        assert not panel.cancel_btn.isEnabled()
        assert not panel.resume_btn.isEnabled()
    finally:
        stop(ctx2)


def test_a_paused_download_can_be_discarded(ctx, qtbot, hub, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "models"
    dl = start_slowly(ctx, qtbot, hub, target)
    dl.pause()
    qtbot.waitUntil(lambda: dl.state.status == "paused", timeout=30_000)
    assert partials(target)
    panel = DownloadPanel(ctx)
    qtbot.addWidget(panel)
    assert panel.cancel_btn.isEnabled()
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Cancel)
    panel.cancel_btn.click()
    assert partials(target)  # said no: nothing deleted
    assert dl.state.status == "paused"
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    panel.cancel_btn.click()
    assert not partials(target)
    assert dl.state.status == "cancelled"


def test_a_disabled_red_button_is_not_drawn_red(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    from k3desk.ui import theme

    panel = DownloadPanel(ctx)
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    button = panel.cancel_btn
    assert not button.isEnabled()
    image = button.grab().toImage()
    danger = QColor(theme.current().danger)

    def reddish(c: QColor) -> bool:
        return (
            abs(c.red() - danger.red()) < 40
            and abs(c.green() - danger.green()) < 40
            and abs(c.blue() - danger.blue()) < 40
        )

    red = sum(
        reddish(image.pixelColor(x, y)) for x in range(image.width()) for y in range(image.height())
    )
    assert red == 0
