"""Switching models asks first: a loaded (or loading) model is stopped only when the
person says so, told how long the new one takes to load, and the new model starts a
new conversation unless they choose to continue the one open."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from PySide6.QtWidgets import QMessageBox, QWidget

from k3desk.core.app.model_switch import switch_question

if TYPE_CHECKING:
    from k3desk.ui.engine.controller import EngineController, LaunchRequest

SwitchChoice = Literal["new", "continue"]


def ask_switch(
    parent: QWidget, engine: EngineController, req: LaunchRequest
) -> SwitchChoice | None:
    """ "new" (the default) or "continue" once the person agrees to stop the running
    model; None when they keep it.  Nothing runs: "new", without a question."""
    if not engine.running:
        return "new"
    text, detail = switch_question(engine.model_name(), req.model_name, engine.ready, req.plan)
    box = QMessageBox(parent)
    box.setObjectName("switchModelBox")
    box.setIcon(QMessageBox.Icon.Question)
    box.setWindowTitle("Switch models?")
    box.setText(text)
    box.setInformativeText(detail)
    new = box.addButton("Load in a new chat", QMessageBox.ButtonRole.AcceptRole)
    cont = box.addButton("Load and continue this chat", QMessageBox.ButtonRole.ActionRole)
    keep = box.addButton(QMessageBox.StandardButton.Cancel)
    keep.setText("Keep the one running")
    box.setDefaultButton(new)
    box.exec()
    clicked = box.clickedButton()
    return "new" if clicked is new else "continue" if clicked is cont else None
