"""What this machine's measurements change about a launch, entered in one place.

Two kinds of record: the settings ``k3desk tune`` kept for a model on this machine
(threads, batch sizes, ``--n-cpu-moe``, the projector's place; :mod:`tuned`), which a
launch is *planned with*, and the speeds runs here measured (:mod:`calibration`),
which correct the plan's *prediction* without changing what is started.  A
:class:`LaunchTuning` holds both; the launch use-case hands :meth:`LaunchTuning.settings`
to :func:`k3desk.core.engines.launch.prepare_launch` and calibrates the plan it gets
back, and the plan view does the same, so no other code reads either record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.model import LaunchPlan, PlanOptions
from k3desk.core.tuning.calibration import CalibrationStore, calibrate_plan
from k3desk.core.tuning.tuned import TunedStore, apply_tuned


@dataclass(frozen=True)
class LaunchTuning:
    tuned: TunedStore | None  # None: plan without the tuned settings
    calibration: CalibrationStore | None  # None: predictions as the speed model makes them

    @classmethod
    def at(cls, state: Path) -> LaunchTuning:
        """The records kept under the app's state folder."""
        return cls(TunedStore(state), CalibrationStore(state))

    def settings(
        self, hw: HardwareProfile, layout: ModelLayout, options: PlanOptions
    ) -> tuple[PlanOptions, str]:
        """``options`` with the tuned settings (unless ``options`` set any of them), and
        the note that says so ("" when nothing was applied)."""
        return apply_tuned(self.tuned, hw, layout, options)

    def calibrate(self, hw: HardwareProfile, layout: ModelLayout, plan: LaunchPlan) -> LaunchPlan:
        """``plan`` with its speed carrying what runs here measured."""
        return calibrate_plan(self.calibration, hw, layout, plan)
