"""What every step of the wizard shares: the step ids, and the page base class."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QWizardPage

from k3desk.ui.widgets import scroll_body

if TYPE_CHECKING:
    from k3desk.ui.context import AppContext
    from k3desk.ui.wizard.wizard import TierWizard


class Step(IntEnum):
    """The wizard's steps, as its page ids (the cluster step only with "Several machines")."""

    MACHINE = 0
    CLUSTER = 1
    TIERS = 2
    WHERE = 3
    DOWNLOAD = 4
    ENGINE = 5

    @property
    def key(self) -> str:
        """The step's name for tests and the automation hook: "machine", "tiers", ..."""
        return self.name.lower()


class StepPage(QWizardPage):
    """A step of the wizard: a title, a subtitle and a vertical layout (``lay``).

    The layout lives in a scroll area without a frame: where the screen is smaller than
    what the step needs (a 1024x700 laptop), the step scrolls instead of squeezing its
    tables to no rows or pushing its buttons out of reach."""

    def __init__(self, ctx: AppContext, wizard: TierWizard, title: str, sub: str) -> None:
        super().__init__()
        self.ctx = ctx
        self.wiz = wizard
        self.setTitle(title)
        self.setSubTitle(sub)
        self.lay = scroll_body(self, "stepScroll")
        self.lay.setSpacing(10)
