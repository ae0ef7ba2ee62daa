"""The wizard's cluster step ("Several machines"): the Cluster page's clusters part (list,
editor, probe, engine choice, verdict), embedded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from k3desk.ui.wizard.base import StepPage

if TYPE_CHECKING:
    from k3desk.ui.cluster.page import ClusterPage
    from k3desk.ui.context import AppContext
    from k3desk.ui.wizard.wizard import TierWizard


class ClusterStepPage(StepPage):
    """The Cluster page's clusters part (list, editor, probe, engine choice, verdict)."""

    def __init__(self, ctx: AppContext, wizard: TierWizard) -> None:
        from k3desk.ui.cluster.page import ClusterPage

        super().__init__(
            ctx,
            wizard,
            "Your machines",
            "Pick or add the cluster (nodes reached over SSH, keys only), probe it and choose "
            "the engine. The next steps judge every tier for it and start it there.",
        )
        self.view: ClusterPage = ClusterPage(ctx, None, embedded=True)
        self.view.setObjectName("wizardCluster")
        self.lay.addWidget(self.view, 1)
        self.view.changed.connect(self.completeChanged)

    def initializePage(self) -> None:
        self.view.activated()

    def isComplete(self) -> bool:
        return self.view.current() is not None
