"""Use-case "judge the tiers for a cluster": one row per tier with the engine's own
refusals and the cross-node memory plan from the probe, in the words every shell uses.

The assessment itself is the cluster core's (:mod:`k3desk.core.cluster.assess`); this
module only names its verdict and picks the row to preselect.  Kept apart from
:mod:`k3desk.core.app.tiers` so that the shells can import it without the planner.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from k3desk.core.catalog.model import Tier
    from k3desk.core.cluster.assess import Assessment

SPARKINFER_ONLY = "SparkInfer loads only vcruz305's UD-IQ1_S"


@dataclass(frozen=True)
class ClusterTierRow:
    """One catalog tier judged for a cluster and an engine: the engine's own refusals and
    the cross-node memory plan from the probe (no speed prediction: the engines report it)."""

    tier: Tier
    assessment: Assessment

    @property
    def runs(self) -> bool:
        """Nothing refuses it and no node is known to be short of memory."""
        a = self.assessment
        return a.ok and (a.plan is None or a.plan.verdict != "no-fit")

    @property
    def fits(self) -> bool:
        """It runs and the probed nodes have room for it."""
        plan = self.assessment.plan
        return self.runs and plan is not None and plan.verdict in ("fits", "tight")

    @property
    def label(self) -> str:
        """The verdict in words: the engine's refusal, or the memory plan's verdict."""
        from k3desk.core.cluster.sparkinfer import GEOMETRY_ERROR

        a = self.assessment
        if not a.ok:
            if any(GEOMETRY_ERROR in r for r in a.refusals):
                return "refused: SparkInfer cannot load it"
            first = a.refusals[0]
            return "refused: " + (first if len(first) <= 70 else first[:69].rstrip() + "…")
        plan = a.plan
        if plan is None:
            return "can start (probe for the memory plan)"
        if plan.verdict == "fits":
            return "fits on the cluster"
        if plan.verdict == "tight":
            return "fits, with little room"
        if plan.verdict == "no-fit":
            return f"won't fit: {plan.reason}"
        return f"unknown: {plan.reason}"

    def detail(self) -> str:
        """The assessment in lines: title, plan, refusals (✗) and warnings (!)."""
        a = self.assessment
        lines = [f"{a.title}"]
        if a.plan is not None:
            lines.append(f"{a.plan.verdict}: {a.plan.reason}")
        lines += [f"✗ {r}" for r in a.refusals]
        lines += [f"! {w}" for w in a.warnings]
        return "\n".join(lines)


def cluster_pick(rows: Iterable[ClusterTierRow]) -> ClusterTierRow | None:
    """The row preselected for a cluster: the first (best quality) that fits, else the
    first that can start; never a reference tier."""
    candidates = [r for r in rows if not r.tier.reference]
    return next((r for r in candidates if r.fits), None) or next(
        (r for r in candidates if r.runs), None
    )
