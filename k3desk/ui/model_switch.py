"""Switching models asks first: a loaded (or loading) model is stopped only when the
person says so, told how long the new one takes to load, and the new model starts a
new conversation unless they choose to continue the one open."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from PySide6.QtWidgets import QMessageBox, QWidget

from k3desk.core.units import fmt_duration

if TYPE_CHECKING:
    from k3desk.ui.engine.controller import EngineController, LaunchRequest

SwitchChoice = Literal["new", "continue"]


def load_time_text(req: LaunchRequest) -> str:
    """How long ``req``'s model takes to load, from its plan ("" when unplanned)."""
    plan = req.plan
    if plan is None or plan.load_seconds <= 0:
        return ""
    return f"up to {fmt_duration(plan.load_seconds)}"


def switch_question(engine: EngineController, req: LaunchRequest) -> tuple[str, str]:
    """The question and what it costs, as the person reads them."""
    old = engine.model_name() or "The model running now"
    new = req.model_name or "the new model"
    doing = "is loaded" if engine.ready else "is loading"
    load = load_time_text(req)
    takes = f" {new} takes {load} to load." if load else ""
    return (
        f"{old} {doing}. Stop it and load {new}?",
        f"{old} stops now.{takes} {new} starts a new conversation; the one open now stays "
        "in the list. Continue it instead to keep talking there.",
    )


def ask_switch(
    parent: QWidget, engine: EngineController, req: LaunchRequest
) -> SwitchChoice | None:
    """ "new" (the default) or "continue" once the person agrees to stop the running
    model; None when they keep it.  Nothing runs: "new", without a question."""
    if not engine.running:
        return "new"
    text, detail = switch_question(engine, req)
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
