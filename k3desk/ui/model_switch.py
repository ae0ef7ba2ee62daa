"""Switching models asks first: a loaded (or loading) model is stopped only when the
person says so, told how long the new one takes to load, and the new model starts a
new conversation unless they choose to continue the one open."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from PySide6.QtWidgets import QMessageBox, QWidget

from k3desk.core.app.model_switch import switch_names, switch_question

if TYPE_CHECKING:
    from k3desk.ui.engine.controller import EngineController, LaunchRequest

SwitchChoice = Literal["new", "continue"]


def ask_switch(
    parent: QWidget, engine: EngineController, req: LaunchRequest, pictures: int = 0
) -> SwitchChoice | None:
    """ "new" (the default) or "continue" once the person agrees to stop the running
    model; None when they keep it.  Nothing runs: "new", without a question.
    ``pictures``: those of the open conversation (said when the new model cannot see)."""
    if not engine.running:
        return "new"
    old, new_name = switch_names(
        engine.model_name(), req.model_name, running_shard(engine), req.shard
    )
    blind = 0 if req.vision else pictures
    text, detail = switch_question(old, new_name, engine.ready, req.plan, blind)
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


def switch_to(
    parent: QWidget, engine: EngineController, req: LaunchRequest, pictures: int = 0
) -> SwitchChoice | None:
    """Launch ``req`` once the person agrees to stop the model running (asked as
    :func:`ask_switch` asks): the one way to switch models, from "Chat with it" on My
    models and from the chat header's picker.  None when they keep the running one."""
    choice = ask_switch(parent, engine, req, pictures)
    if choice is not None:
        engine.launch(replace(req, continue_chat=choice == "continue"))
    return choice


def running_shard(engine: EngineController) -> Path | None:
    """The first shard of the model the engine runs (or loads) now, where known."""
    if not engine.running:
        return None
    kept = engine.background
    if kept is not None:  # taken up from the background: the model launched last
        last = engine.last_model()
        return Path(last.shard) if last is not None and last.name == kept.model_name else None
    req = engine.request
    if req is None:
        return None
    if req.shard is not None:
        return req.shard
    args = list(req.spec.args)  # started with arguments given directly: its -m
    return Path(args[args.index("-m") + 1]) if "-m" in args[:-1] else None
