"""My models on the Models page: added with the button or by dropping on the window, found
in the Settings folders, refused with the reason when bad, found again on the next start."""

from __future__ import annotations

import shutil
from pathlib import Path

from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog

from k3desk.core.app.cells import shown_path
from k3desk.ui.pages import PageKey
from k3desk.ui.window import MainWindow


def window(ctx, qtbot) -> MainWindow:  # type: ignore[no-untyped-def]
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    w.show_page(PageKey.MODELS)
    return w


def drop(w: MainWindow, path: Path) -> bool:
    md = QMimeData()
    md.setUrls([QUrl.fromLocalFile(str(path))])
    enter = QDragEnterEvent(
        QPoint(300, 300),
        Qt.DropAction.CopyAction,
        md,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(w, enter)
    if not enter.isAccepted():
        return False
    ev = QDropEvent(
        QPointF(300, 300),
        Qt.DropAction.CopyAction,
        md,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(w, ev)
    return True


def test_add_with_the_button_then_drop_a_folder_and_find_them_after_a_restart(  # type: ignore[no-untyped-def]
    ctx, qtbot, tiny_k3, tiny_k3_single, monkeypatch, hardware_file
) -> None:
    ctx.hardware.load_file(hardware_file("8xH100-2TB"))  # judged quickly and the same anywhere
    w = window(ctx, qtbot)
    mine = w.models_page().mine
    qtbot.waitUntil(lambda: mine.judgement is not None, timeout=60_000)
    assert not mine.rows()
    assert "No models of your own yet" in mine.status.text()
    assert not mine.chat_btn.isEnabled()
    assert mine.chat_btn.toolTip()
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(tiny_k3.parts[1]), ""))
    mine.add_file.click()
    qtbot.waitUntil(lambda: len(mine.rows()) == 1, timeout=30_000)
    (row,) = mine.shown_rows()
    assert row["shard"] == str(tiny_k3.first_part)  # part 2 was chosen: the set is meant
    assert row["model"] == "Tiny-K3-IQ1_S"
    assert row["vision"] == "yes"
    assert row["tier"] == "—"
    assert row["where"] == shown_path(tiny_k3.first_part.parent)  # the folder, not "added"
    assert row["speed"].endswith("tok/s")
    assert "8xH100-2TB.json" in mine.status.text()
    # a folder dropped on the window (on whatever page is shown)
    w.show_page(PageKey.CHAT)
    assert drop(w, tiny_k3_single.first_part.parent)
    assert w.current_page() == "models"
    qtbot.waitUntil(lambda: len(mine.rows()) == 2, timeout=30_000)
    assert mine.current() is not None
    assert mine.current().model.shard == tiny_k3_single.first_part
    assert mine.shown_rows()[1]["vision"] == "no"
    # something else dropped is not taken
    txt = tiny_k3.first_part.parent / "notes.txt"
    txt.write_text("hello")
    assert not drop(w, txt)
    # a new window on the same home finds them again
    w.close()
    w2 = window(ctx, qtbot)
    mine2 = w2.models_page().mine
    qtbot.waitUntil(lambda: len(mine2.rows()) == 2, timeout=30_000)


def test_bad_input_says_what_is_wrong_and_changes_nothing(  # type: ignore[no-untyped-def]
    ctx, qtbot, tiny_k3, tmp_path, hardware_file
) -> None:
    ctx.hardware.load_file(hardware_file("8xH100-2TB"))
    w = window(ctx, qtbot)
    mine = w.models_page().mine
    qtbot.waitUntil(lambda: mine.judgement is not None, timeout=60_000)
    partial = tmp_path / "partial"
    partial.mkdir()
    for p in tiny_k3.parts[:2]:
        shutil.copy2(p, partial / p.name)
    for path, words in (
        (partial / tiny_k3.parts[0].name, "is missing"),
        (tmp_path / "nowhere", "does not exist"),
        (tiny_k3.mmproj, "vision projector, not a model"),
    ):
        ctx.reporter.last = None
        mine.add_paths([path])
        qtbot.waitUntil(lambda: ctx.reporter.last is not None, timeout=30_000)
        assert words in ctx.reporter.last[0]
        qtbot.waitUntil(lambda w=words: w in mine.status.text(), timeout=10_000)
        assert not mine.rows()
    assert not (ctx.services.paths.data / "models.json").exists()


def test_a_model_folder_in_settings_shows_its_sets(  # type: ignore[no-untyped-def]
    ctx, qtbot, tiny_k3, tmp_path, hardware_file
) -> None:
    ctx.hardware.load_file(hardware_file("8xH100-2TB"))
    w = window(ctx, qtbot)
    mine = w.models_page().mine
    qtbot.waitUntil(lambda: mine.judgement is not None, timeout=60_000)
    folder = tmp_path / "shelf"
    shutil.copytree(tiny_k3.first_part.parent, folder / "tiny")
    ctx.update_settings(model_dirs=(str(folder),))
    qtbot.waitUntil(lambda: len(mine.rows()) == 1, timeout=30_000)
    (row,) = mine.shown_rows()
    assert row["where"] == shown_path(folder / "tiny")  # the folder its files are in (D21)
    assert str(folder) in mine.table.item(0, 6).toolTip()  # and the model folder it was found in
    assert row["vision"] == "yes"
    mine.select(row["id"])
    assert not mine.remove_btn.isEnabled()
    assert "Settings" in mine.remove_btn.toolTip()
