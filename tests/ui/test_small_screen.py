"""At 1024x700 (a small laptop screen) nothing the person needs is cut off or off-screen:
every page and every step of the wizard at that screen's window size, at 976 px wide and
at the window's smallest size, judged by ``tests/ui/layout_check.py`` (a button or label
narrower than its text, a widget past the window's edge, a table that cannot show three
rows, two widgets over each other)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication

from k3desk.core.app.background import LAST_MODEL_KEY, LastModel
from k3desk.ui.pages import PageKey
from k3desk.ui.window import GEOMETRY_KEY, PAGES, MainWindow
from tests.hubserver import HubServer
from tests.ui.layout_check import problems
from tests.ui.test_wizard import open_wizard_for


def test_the_composer_hint_wraps_instead_of_being_cut(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.resize(1024, 700)
    w.show()
    qtbot.waitExposed(w)
    chat = w.chat_page()
    hint = chat.composer.hint
    qtbot.waitUntil(lambda: bool(hint.text()), timeout=2000)
    assert "Cluster page (Ctrl+6)" in hint.text()  # the whole reason, to its end
    qtbot.wait(50)
    if not hint.wordWrap():
        assert hint.sizeHint().width() <= hint.width()  # one line, and it fits
    else:
        assert hint.height() >= hint.heightForWidth(hint.width())  # every line shown
    assert hint.geometry().right() <= chat.composer.width()


def test_the_wizard_opens_inside_the_screen(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    wizard = w.open_wizard()
    free = (wizard.screen() or QGuiApplication.primaryScreen()).availableGeometry()
    assert wizard.width() <= max(free.width(), wizard.minimumSizeHint().width())
    assert wizard.height() <= max(free.height(), wizard.minimumSizeHint().height())
    wizard.reject()


def test_every_models_column_is_on_screen_at_1024(ctx, qtbot, hardware_file) -> None:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.resize(1024, 700)
    w.show()
    ctx.hardware.load_file(hardware_file("8xH100-2TB"))
    page = w.models_page()
    w.show_page("models")
    table = page.table
    qtbot.waitUntil(lambda: table.rowCount() > 0, timeout=60_000)
    qtbot.wait(50)
    h = table.horizontalHeader()
    shown = sum(h.sectionSize(i) for i in range(table.columnCount()))
    assert shown <= table.viewport().width()  # no column behind a horizontal scroll
    assert not table.horizontalScrollBar().isVisible()
    assert all(h.sectionSize(i) > 30 for i in range(table.columnCount()))


# ---------------------------------------------------------------- every page, every step
# A 1024x700 laptop screen gives the window 976x652 (``fit_screen`` leaves room for the
# frame and the panel); 900x600 is the smallest the window lets itself be made.
SIZES = [(1024, 700), (976, 652), (900, 600)]


def _settle(qtbot) -> None:  # type: ignore[no-untyped-def]
    qtbot.wait(120)


@pytest.fixture
def launched_before(ctx, tmp_path):  # type: ignore[no-untyped-def]
    """A model launched in an earlier session, with a long name: the chat's header then
    offers "Relaunch <name>" beside Export, Delete and Chat settings."""
    shard = tmp_path / "Kimi-K3-UD-IQ1_S-00001-of-00009.gguf"
    shard.write_bytes(b"GGUF")
    ctx.update_settings(ctx=4096)  # a settings file, so recent facts are kept
    last = LastModel(str(shard), "", "Kimi-K3 UD-IQ1_S (vcruz305, the 9-part set)")
    ctx.remember(**{LAST_MODEL_KEY: last.to_json()})
    return last


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_every_page_shows_everything_at_a_small_size(  # type: ignore[no-untyped-def]
    ctx, qtbot, launched_before, width, height
) -> None:
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.resize(width, height)
    w.show()
    qtbot.waitExposed(w)
    assert (w.width(), w.height()) == (width, height)
    found = {}
    for spec in PAGES:
        w.show_page(spec.key)
        if spec.key == PageKey.MODELS:
            table = w.models_page().table
            qtbot.waitUntil(lambda: table.rowCount() > 0, timeout=60_000)  # noqa: B023
        _settle(qtbot)
        found[spec.key.value] = problems(w)
    chat = w.chat_page()
    w.show_page(PageKey.CHAT)
    _settle(qtbot)
    assert chat.relaunch_btn.isVisible()  # the header's widest state was the one judged
    assert problems(w) == []
    assert all(not p for p in found.values()), found


@pytest.mark.parametrize(("width", "height"), SIZES[1:])
def test_every_wizard_step_shows_everything_and_the_hub_rows_at_a_small_size(  # type: ignore[no-untyped-def]
    ctx, qtbot, tiny_k3, hardware_file, monkeypatch, width, height
) -> None:
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    with HubServer() as hub:
        files: dict[str, bytes | Path] = {f"IQ1_S/{p.name}": p.read_bytes() for p in tiny_k3.parts}
        files["mmproj-Tiny-K3-F16.gguf"] = tiny_k3.mmproj.read_bytes()
        hub.add_repo("tester/Kimi-K3-Tiny-GGUF", files)
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        wiz = open_wizard_for(w, qtbot, hardware_file("no-gpu-laptop-32GB"))
        wiz.resize(width, height)
        qtbot.waitExposed(wiz)
        _settle(qtbot)
        seen = {wiz.current_key(): problems(wiz)}
        wiz.next()
        box = wiz.tiers.hub
        qtbot.waitUntil(lambda: box.result is not None and not box.searching, timeout=120_000)
        _settle(qtbot)
        assert box.table.rowCount() > 0
        assert box.table.isVisibleTo(wiz)
        seen["tiers"] = problems(wiz)
        for _ in range(3):  # where, download, engine
            before = wiz.current_key()
            wiz.next()
            _settle(qtbot)
            if wiz.current_key() == before:
                break
            seen[wiz.current_key()] = problems(wiz)
        wiz.reject()
    assert len(seen) >= 3, seen
    assert all(not p for p in seen.values()), seen


def test_a_saved_size_smaller_than_the_window_allows_is_not_restored(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    ctx.update_settings(ctx=4096)
    ctx.remember(**{GEOMETRY_KEY: {"x": 10, "y": 10, "w": 640, "h": 420, "maximized": False}})
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    # at least the window's smallest size (900x600, the last of SIZES, where every page was
    # shown whole above; less only on a screen smaller than that: this test screen is
    # 800x600), never the 640x420 saved
    assert w.width() >= w.minimumWidth() > 640
    assert w.height() >= w.minimumHeight() > 420
