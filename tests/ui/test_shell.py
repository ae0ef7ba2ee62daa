"""The main window shell, its pages, and the Settings page."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

from k3desk.ui.window import PAGES, MainWindow


def test_every_page_builds_on_demand_and_says_what_to_do(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    free = w.screen().availableGeometry()  # 1280x800, or less on a smaller screen
    assert (w.width(), w.height()) == (min(1280, free.width() - 48), min(800, free.height() - 48))
    assert w.built_pages() == []
    for spec in PAGES:
        page = w.show_page(spec.key)
        assert w.current_page() == spec.key
        assert w.stack.currentWidget() is page
    assert w.built_pages() == [s.key for s in PAGES]
    chat = w.page("chat")
    assert not chat.composer.send_btn.isEnabled()
    assert "No engine is running" in chat.composer.send_btn.toolTip()
    assert "Engine page" in chat.view.toPlainText()
    engine = w.page("engine")
    assert not engine.panel.launch_btn.isEnabled()
    assert "first shard" in engine.panel.launch_btn.toolTip()
    assert not engine.panel.stop_btn.isEnabled()
    assert engine.url.edit.text() == ""  # no address to copy; the state line says why
    assert not engine.url.copy.isEnabled()
    downloads = w.page("downloads")
    assert "Pick a tier" in downloads.panel.where.text()
    assert not downloads.panel.pause_btn.isEnabled()
    assert downloads.panel.pause_btn.toolTip() == "Nothing is downloading."


def test_ctrl_number_shortcuts_switch_pages(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtGui import QShortcut

    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    shortcuts = {sc.key().toString(): sc for sc in w.findChildren(QShortcut)}
    pages = [f"Ctrl+{i}" for i in range(1, len(PAGES) + 1)]
    assert sorted(k for k in shortcuts if k[5:].isdigit()) == pages
    assert set(shortcuts) - set(pages) == {"F1", "Ctrl+/"}  # the list of shortcuts
    shortcuts["Ctrl+5"].activated.emit()
    assert w.current_page() == "settings"
    shortcuts["Ctrl+2"].activated.emit()
    assert w.current_page() == "models"


def test_settings_page_saves_validated_values_and_applies_the_theme(ctx, qtbot, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from k3desk.ui import theme
    from k3desk.ui.settings_page import SettingsPage

    page = SettingsPage(ctx)
    qtbot.addWidget(page)
    page.ctx_size.setValue(16384)
    page.thinking.setChecked(False)
    page.theme.setCurrentIndex(page.theme.findData("dark"))
    page.engine_binary.setText(str(tmp_path / "missing-llama-server"))
    page.save.click()  # the path is looked at off the GUI thread
    qtbot.waitUntil(lambda: "does not exist" in page.status.text(), timeout=10_000)
    assert not ctx.store.exists  # nothing saved while a value is wrong
    page.engine_binary.setText("")
    page.save.click()
    saved = json.loads(ctx.store.path.read_text())
    assert saved["ctx"] == 16384
    assert saved["thinking"] is False
    assert saved["theme"] == "dark"
    assert theme.current().dark
    assert not page.save.isEnabled()
    assert page.save.toolTip() == "Nothing has changed since the last save."
    ctx.update_settings(theme="light")
    assert not theme.current().dark


def release_readers(fifo: Path, after: float, within: float = 15.0) -> None:
    """Open ``fifo`` for writing once, ``after`` seconds from now, on a thread: a reader
    blocked on it then returns (a test fails instead of hanging for ever)."""

    def writer() -> None:
        time.sleep(after)
        end = time.monotonic() + within
        while time.monotonic() < end:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                return
            except OSError as exc:  # ENXIO: nobody reads it (what should happen)
                if exc.errno != errno.ENXIO:
                    return
                time.sleep(0.1)

    threading.Thread(target=writer, name="fifo-writer", daemon=True).start()


def test_saving_a_named_pipe_as_the_engine_never_blocks_the_window(ctx, qtbot, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from k3desk.ui.settings_page import SettingsPage

    page = SettingsPage(ctx)
    qtbot.addWidget(page)
    fifo = tmp_path / "llama-server"
    os.mkfifo(fifo)
    release_readers(fifo, after=3.0)
    page.engine_binary.setText(str(fifo))
    t0 = time.monotonic()
    page.save.click()
    assert time.monotonic() - t0 < 1.0  # the GUI thread never waited on the pipe
    qtbot.waitUntil(lambda: "named pipe (FIFO)" in page.status.text(), timeout=10_000)
    assert not ctx.store.exists  # nothing saved
    assert page.save.isEnabled()  # and it can be corrected and saved again


def test_token_is_stored_through_the_token_store_and_shown_masked(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    from k3desk.core.hub.tokens import TokenStore
    from k3desk.ui.settings_page import SettingsPage
    from tests.fixtures.hub import FakeKeyringModule, MemoryKeyring

    ring = MemoryKeyring()
    ctx.__dict__["token_store"] = TokenStore(env={}, keyring_module=FakeKeyringModule(ring))
    page = SettingsPage(ctx)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: page.token_state.text() == "No token saved", timeout=5000)
    assert not page.token_remove.isEnabled()
    secret = "hf_abcdefghijklmnopqrstuvwxyz1234"
    page.token_edit.setText(secret)
    page.token_save.click()
    qtbot.waitUntil(lambda: page.token_state.text() == "hf_…1234", timeout=5000)
    assert ring.store[("k3desk", "huggingface-token")] == secret
    assert secret not in ctx.store.path.read_text() if ctx.store.exists else True
    assert page.token_edit.text() == ""
    page.token_remove.click()
    qtbot.waitUntil(lambda: page.token_state.text() == "No token saved", timeout=5000)
    assert ring.store == {}
