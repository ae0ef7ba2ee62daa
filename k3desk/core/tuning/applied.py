"""What this machine's measurements change about a launch, entered in one place.

Three kinds of record: the settings ``k3desk tune`` kept for a model on this machine
(threads, batch sizes, ``--n-cpu-moe``, the projector's place; :mod:`tuned`), which a
launch is *planned with*; this CPU's own kernel speed against the machine the shipped
costs were measured on (:mod:`cpuprobe`), which the plan's prediction is *made with*;
and the speeds runs here measured (:mod:`calibration`), which correct the prediction
without changing what is started.  A :class:`LaunchTuning` holds them; the launch
use-case hands :meth:`LaunchTuning.settings` to
:func:`k3desk.core.engines.launch.prepare_launch` and calibrates the plan it gets
back, and the plan view does the same, so no other code reads these records.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.model import LaunchPlan, PlanOptions
from k3desk.core.tuning.calibration import CalibrationStore, calibrate_plan
from k3desk.core.tuning.cpuprobe import CpuProbeStore
from k3desk.core.tuning.tuned import TunedStore, apply_tuned


@dataclass(frozen=True)
class LaunchTuning:
    tuned: TunedStore | None  # None: plan without the tuned settings
    calibration: CalibrationStore | None  # None: predictions as the speed model makes them
    probe: CpuProbeStore | None = None  # None: the kernel costs as shipped

    @classmethod
    def at(cls, state: Path) -> LaunchTuning:
        """The records kept under the app's state folder."""
        return cls(TunedStore(state), CalibrationStore(state), CpuProbeStore(state))

    def settings(
        self, hw: HardwareProfile, layout: ModelLayout, options: PlanOptions
    ) -> tuple[PlanOptions, str]:
        """``options`` with the tuned settings (unless ``options`` set any of them) and
        this CPU's kernel speed (unless ``options`` carry one), and the notes that say
        so ("" when nothing was applied)."""
        options, note = apply_tuned(self.tuned, hw, layout, options)
        probe = self.probe.get(hw) if self.probe is not None else None
        if probe is None or options.kernel_scale is not None:
            return options, note
        scaled = replace(options, kernel_scale=probe.scale())
        return scaled, " ".join(x for x in (note, probe.sentence()) if x)

    def calibrate(self, hw: HardwareProfile, layout: ModelLayout, plan: LaunchPlan) -> LaunchPlan:
        """``plan`` with its speed carrying what runs here measured (since this CPU's
        kernel check, whose costs the plan was predicted with)."""
        probe = self.probe.get(hw) if self.probe is not None else None
        since = probe.when if probe is not None else 0.0
        return calibrate_plan(self.calibration, hw, layout, plan, since)
