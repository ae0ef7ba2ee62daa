"""The wheel scrolls the Settings page instead of changing the value under the pointer; the
controls can be seen in both themes."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QColor, QImage, QWheelEvent
from PySide6.QtWidgets import QApplication, QRadioButton, QSpinBox


def wheel(widget, steps: int = -3) -> None:  # type: ignore[no-untyped-def]
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    glob = QPointF(widget.mapToGlobal(pos.toPoint()))
    ev = QWheelEvent(
        pos,
        glob,
        QPoint(0, 0),
        QPoint(0, 120 * steps),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(widget, ev)


def test_the_wheel_changes_a_spin_box_only_when_it_has_the_focus(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    from k3desk.ui.settings_page import SettingsPage

    page = SettingsPage(ctx)
    qtbot.addWidget(page)
    page.resize(1024, 500)
    page.show()
    qtbot.waitExposed(page)
    box = page.ctx_size
    before = box.value()
    page.activateWindow()
    qtbot.waitUntil(page.isActiveWindow, timeout=2000)
    page.save.setFocus()
    scroll = box.parentWidget()
    while scroll is not None and not hasattr(scroll, "verticalScrollBar"):
        scroll = scroll.parentWidget()
    assert scroll is not None
    bar = scroll.verticalScrollBar()
    bar.setValue(0)
    wheel(box, -3)  # the pointer over the box, the focus elsewhere
    assert box.value() == before
    assert not box.hasFocus()
    if bar.maximum() > 0:
        assert bar.value() > 0  # the page scrolled instead
    box.setFocus()
    qtbot.waitUntil(box.hasFocus, timeout=2000)
    wheel(box, 1)
    assert box.value() == before + box.singleStep()  # focused: the wheel is for it


def painted_colors(widget) -> set[str]:  # type: ignore[no-untyped-def]
    img: QImage = widget.grab().toImage()
    return {QColor(img.pixel(x, y)).name() for x in range(img.width()) for y in range(img.height())}


def test_spin_arrows_and_unchecked_radios_are_visible_in_both_themes(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    from k3desk.ui import theme

    for name in ("light", "dark"):
        ctx.theme.apply(name)
        c = theme.current()
        box = QSpinBox()
        box.setRange(0, 10)
        box.setValue(5)
        radio = QRadioButton("off")
        for w in (box, radio):
            qtbot.addWidget(w)
            w.resize(120, 32)
            w.show()
        qtbot.waitExposed(box)
        # the arrows are drawn in the text colour, beside the number
        arrows = box.grab().toImage().copy(box.width() - 22, 0, 22, box.height())
        seen = {
            QColor(arrows.pixel(x, y)).name()
            for x in range(arrows.width())
            for y in range(arrows.height())
        }
        assert c.text.lower() in seen, name
        # the unchecked circle stands out from the background
        ring = radio.grab().toImage().copy(0, 0, 22, radio.height())
        far = [
            QColor(ring.pixel(x, y))
            for x in range(ring.width())
            for y in range(ring.height())
        ]
        base = QColor(c.window)
        assert max(abs(p.lightness() - base.lightness()) for p in far) > 60, name


def test_file_dialogs_open_in_the_models_folder_and_pictures(
    ctx, qtbot, monkeypatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtWidgets import QFileDialog

    from k3desk.ui.chat.page import ChatPage
    from k3desk.ui.engine.page import EnginePage

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "Pictures").mkdir()
    opened: list[str] = []

    def one(_parent, _title, folder="", _filter=""):  # type: ignore[no-untyped-def]
        opened.append(folder)
        return "", ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", one)
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", one)
    engine = EnginePage(ctx)
    qtbot.addWidget(engine)
    engine.panel._browse_shard()
    assert opened[-1] == str(ctx.services.paths.models_dir)
    chat = ChatPage(ctx)
    qtbot.addWidget(chat)
    chat.composer._choose()
    assert opened[-1] == str(tmp_path / "Pictures")
    assert all("resources" not in Path(p).parts for p in opened)


def test_saved_to_is_cleared_by_the_next_edit(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    from k3desk.ui.settings_page import SettingsPage

    page = SettingsPage(ctx)
    qtbot.addWidget(page)
    page.ctx_size.setValue(16384)
    page.save.click()
    assert page.status.text().startswith("Saved to")
    page.ctx_size.setValue(4096)  # a new edit: not saved yet
    assert page.status.text() == ""
    assert page.save.isEnabled()
