"""Closing the window with a running engine asks first; the window's size comes back."""

from __future__ import annotations

import pytest

from k3desk.ui.window import MainWindow

pytestmark = [pytest.mark.engine]


def test_the_window_size_comes_back(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    ctx.save_settings(ctx.settings)  # set up before; a first run remembers nothing
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    size = (w.minimumWidth(), w.minimumHeight() + 40)  # within the (800x800) screen
    w.resize(*size)
    qtbot.waitUntil(lambda: (w.width(), w.height()) == size, timeout=2000)
    w.close()
    again = MainWindow(ctx)
    qtbot.addWidget(again)
    again.show()
    assert (again.width(), again.height()) == size


def test_closing_with_a_running_engine_asks_and_cancel_keeps_everything(
    ctx, qtbot, launch_engine, llama_server, tiny_k3_single, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    engine = launch_engine(llama_server, tiny_k3_single, vision=False)
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    asked: list[bool] = []
    answers = ["cancel", "stop"]

    def ask() -> str:
        asked.append(True)
        return answers.pop(0)

    monkeypatch.setattr(w, "ask_close", ask)
    w.close()
    assert asked == [True]
    assert w.isVisible()  # cancelled: nothing closed
    assert engine.ready
    w.close()
    assert asked == [True, True]
    assert not w.isVisible()
    ctx.close()  # what the app does on quit: the engine stops
    assert not engine.running or engine.supervisor is None


def test_the_question_names_the_model_and_the_choices(
    ctx, qtbot, launch_engine, llama_server, tiny_k3_single, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    launch_engine(llama_server, tiny_k3_single, vision=False)
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    seen: list[tuple[str, list[str]]] = []

    def answer() -> None:
        box = next((x for x in QApplication.topLevelWidgets() if isinstance(x, QMessageBox)), None)
        if box is None or not box.isVisible():
            QTimer.singleShot(50, answer)
            return
        seen.append((box.text(), [b.text() for b in box.buttons()]))
        box.button(QMessageBox.StandardButton.Cancel).click()

    QTimer.singleShot(50, answer)
    assert w.ask_close() == "cancel"
    text, buttons = seen[0]
    assert text == f"{ctx.engine.model_name()} is loaded. Keep it running after k3desk closes?"
    assert {"Keep it running", "Stop the engine"} <= set(buttons)
    w.close_choice = "stop"  # the window is closed after the test; nobody answers then


def test_a_first_run_and_an_unreadable_settings_file_are_left_alone(ctx, qtbot) -> None:  # type: ignore[no-untyped-def]
    store = ctx.store
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.show()
    w.close()
    assert not store.exists  # the wizard still opens at the next start
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_text("{broken")
    ctx.settings_unreadable = True
    again = MainWindow(ctx)
    qtbot.addWidget(again)
    again.show()
    again.close()
    assert store.path.read_text() == "{broken"  # never overwritten behind the person's back
