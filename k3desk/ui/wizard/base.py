"""What every step of the wizard shares: the step ids, and the page base class."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QVBoxLayout, QWizardPage

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
    """A step of the wizard: a title, a subtitle and a vertical layout."""

    def __init__(self, ctx: AppContext, wizard: TierWizard, title: str, sub: str) -> None:
        super().__init__()
        self.ctx = ctx
        self.wiz = wizard
        self.setTitle(title)
        self.setSubTitle(sub)
        self.lay = QVBoxLayout(self)
        self.lay.setSpacing(10)
