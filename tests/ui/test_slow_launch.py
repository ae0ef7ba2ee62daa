"""A model larger than RAM streams from disk: the app says what that costs and launches it
only when the person accepts (the CLI's --accept-slow)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from k3desk.core.app.launch import LocalLaunchRequest, SlowLaunchError, prepare_local_launch
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.ui.engine.page import confirm_slow_launch

pytestmark = pytest.mark.gui


def _answer(button_text: str | None) -> None:
    """Click ``button_text`` in the open warning (None: Cancel) as soon as it shows."""

    def click() -> None:
        box = next(
            (w for w in QApplication.topLevelWidgets() if w.objectName() == "slowLaunchBox"),
            None,
        )
        if not isinstance(box, QMessageBox) or not box.isVisible():
            QTimer.singleShot(20, click)
            return
        for b in box.buttons():
            if (button_text is None and box.buttonRole(b) == QMessageBox.ButtonRole.RejectRole) or (
                b.text() == button_text
            ):
                b.click()
                return

    QTimer.singleShot(20, click)


def test_a_streaming_launch_is_confirmed_with_its_cost_then_started_as_planned(  # type: ignore[no-untyped-def]
    ctx, qtbot, fake_engine, twin_factory, hardware_file, monkeypatch
) -> None:
    laptop = HardwareProfile.from_json_file(hardware_file("no-gpu-laptop-32GB"))
    monkeypatch.setattr(ctx.services, "this_machine", lambda *a, **k: laptop)
    shard = twin_factory("grearl-iq1s")[0]
    request = LocalLaunchRequest(shard, engine=fake_engine("serve"))
    with pytest.raises(SlowLaunchError) as refused:
        prepare_local_launch(ctx.services, request)
    parent = QWidget()
    qtbot.addWidget(parent)

    _answer(None)  # declined: nothing starts
    assert confirm_slow_launch(parent, refused.value) is None

    _answer("Launch anyway")
    req = confirm_slow_launch(parent, refused.value)
    assert req is not None
    assert req.plan is not None
    assert req.plan.verdict == "stream"
    assert "--no-repack" in req.spec.args
    assert "-ngl" not in req.spec.args
    # any other error is not this dialog's
    assert confirm_slow_launch(parent, ValueError("x")) is None
