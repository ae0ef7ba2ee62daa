"""Use-case "prepare a local launch": a shard set checked, an engine chosen and probed, and
the launch planned for the machine it will run on.

A launch always plans for this machine: whatever a page is judging (a hardware file,
a cluster) never reaches here.  The only other machine a launch may be planned for is
one the person names for this very launch (``k3desk serve/chat --hardware FILE``, a
stand-in for GPUs this machine cannot show), and only while that plan can run here:
when the engine cannot use that machine's GPUs, or its plan fills more RAM than this
machine has, the launch is planned for this machine and its notes say so.

A plan that streams its weights from disk runs (llama.cpp pages them in from the
shards), slowly: it is launched only when the request accepts that
(``accept_slow``); otherwise :class:`SlowLaunchError` carries the warning (seconds per
token, load time) for the shell to ask with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.models import model_name
from k3desk.core.app.subject import Subject
from k3desk.core.engines.launch import PreparedLaunch, prepare_launch
from k3desk.core.errors import PlanError
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.model import DEFAULT_CTX, LaunchPlan, PlanOptions
from k3desk.core.progress import CancelToken, ProgressCallback, no_progress
from k3desk.core.tuning.applied import LaunchTuning
from k3desk.core.tuning.calibration import SpeedTracker
from k3desk.core.tuning.tune import TuneModelRequest, TuneModelResult, forget_tuned, tune_model
from k3desk.core.units import fmt_bytes, fmt_duration

if TYPE_CHECKING:
    from k3desk.core.app.services import Services


@dataclass(frozen=True)
class LocalLaunchRequest:
    shard: Path  # part 1 of the set
    mmproj: Path | None = None
    ctx: int | None = None  # a context size asked for (checked against the model)
    default_ctx: int = DEFAULT_CTX  # without one: this, capped at the trained context
    temperature: float = 1.0
    top_p: float = 0.95
    extra_args: tuple[str, ...] = ()  # passed on to llama-server (--n-cpu-moe is planned)
    engine: Path | None = None  # this engine and no other
    configured_engine: str | None = None  # the one chosen in Settings, tried first
    hardware_file: Path | None = None  # named for this launch only (see the module docstring)
    accept_slow: bool = False  # launch a plan that streams from disk (see the module docstring)
    parallel: int = 1  # requests answered at once (--parallel): the plan counts each slot

    def options(self) -> PlanOptions:
        return PlanOptions(
            ctx=self.ctx,
            default_ctx=self.default_ctx,
            temperature=self.temperature,
            top_p=self.top_p,
            extra_args=self.extra_args,
            parallel=self.parallel,
        )


@dataclass(frozen=True)
class LocalLaunch:
    """A prepared launch and what the shells say about it."""

    prepared: PreparedLaunch
    subject: Subject  # the machine it was planned for
    model_name: str
    # the plan with what this machine's runs measured (core/tuning/calibration.py);
    # None: as prepared
    calibrated: LaunchPlan | None = None
    # compares what the engine will measure with the prediction, and keeps it
    tracker: SpeedTracker | None = field(default=None, compare=False)

    @property
    def plan(self) -> LaunchPlan:
        return self.calibrated or self.prepared.plan


def prepare_local_launch(
    services: Services,
    request: LocalLaunchRequest,
    *,
    cancel: CancelToken | None = None,
    on_progress: ProgressCallback | None = None,
) -> LocalLaunch:
    """Check, choose an engine, probe it and plan (see :func:`prepare_launch`), with the
    settings ``k3desk tune`` kept for the model and the speeds measured here."""
    subject: list[Subject] = []

    def hardware() -> HardwareProfile:
        if request.hardware_file is not None:
            hw = services.load_hardware(request.hardware_file)
            subject.append(Subject.hardware_file(request.hardware_file, hw))
        else:
            hw = services.this_machine()
            subject.append(Subject.this_machine(hw))
        return hw

    here = services.this_machine if request.hardware_file is not None else None
    tuning = LaunchTuning.at(services.paths.state)
    prepared = prepare_launch(
        request.shard,
        mmproj=request.mmproj,
        hardware=hardware,
        options=services.with_disk_rate(request.options(), request.shard),
        paths=services.paths,
        engine=request.engine,
        configured=request.configured_engine,
        catalog=services.catalog_tiers(),
        cancel=cancel,
        on_progress=on_progress,
        tuned=tuning.settings,
        here=here,
    )
    hw, layout = prepared.hardware, prepared.layout
    who = Subject.this_machine(hw) if prepared.replanned_here else subject[0]
    launch = LocalLaunch(
        prepared,
        who,
        model_name(request.shard),
        calibrated=tuning.calibrate(hw, layout, prepared.plan),
        tracker=SpeedTracker(hw, layout, prepared.plan, tuning.calibration),
    )
    if launch.plan.verdict == "stream" and not request.accept_slow:
        raise SlowLaunchError(launch)
    return launch


class SlowLaunchError(PlanError):
    """The plan streams the weights from disk: it runs, at the speed the message says,
    once the person accepts it (``LocalLaunchRequest.accept_slow``; ``--accept-slow``)."""

    def __init__(self, launch: LocalLaunch) -> None:
        super().__init__(
            " ".join(
                filter(
                    None,
                    (slow_warning(launch.plan, launch.model_name), launch.prepared.replanned_here),
                )
            ),
            "Pass --accept-slow to launch it anyway, or free RAM, or choose a smaller tier.",
        )
        self.launch = launch


def slow_warning(plan: LaunchPlan, name: str) -> str:
    """What a launch that streams from disk costs: seconds per token and load time."""
    tps = plan.speed.calibrated_tps or plan.speed.expected_tps
    per_token = f"about {1 / tps:,.0f} s per token" if tps > 0 else "an unknown time per token"
    return (
        f"{name} does not fit in RAM here: {fmt_bytes(plan.stream_bytes)} of its weights "
        "are read from disk as tokens need them. It runs, slowly: "
        f"{per_token} after a load of up to {fmt_duration(plan.load_seconds)} "
        "(it reads every shard once and decodes a test step)."
    )


@dataclass(frozen=True)
class TuneLaunchRequest:
    """``k3desk tune SHARD`` and the Engine page's Tune button: the launch to tune (always
    on this machine: the engine runs here) and how to measure it."""

    launch: LocalLaunchRequest
    prompt_tokens: int = 128  # the fixed test request (core/tuning/tune.py)
    decode_tokens: int = 32
    exhaustive: bool = False  # measure every variant: the sweep the tuner is checked by
    save: bool = True  # keep the fastest for the next launch of this model here


def tune_local_launch(
    services: Services,
    request: TuneLaunchRequest,
    *,
    cancel: CancelToken | None = None,
    on_progress: ProgressCallback | None = None,
) -> TuneModelResult:
    """Measure a few launch variants of the model with the real engine, keep the fastest."""
    r = request.launch
    return tune_model(
        TuneModelRequest(
            shard=r.shard,
            paths=services.paths,
            hardware=services.this_machine,
            options=r.options(),
            mmproj=r.mmproj,
            engine=r.engine,
            configured=r.configured_engine,
            catalog=services.catalog_tiers(),
            prompt_tokens=request.prompt_tokens,
            decode_tokens=request.decode_tokens,
            exhaustive=request.exhaustive,
            save=request.save,
        ),
        progress=on_progress or no_progress,
        cancel=cancel,
    )


def forget_tuned_launch(services: Services, shard: Path) -> bool:
    """Drop what ``k3desk tune`` kept for ``shard``'s model on this machine."""
    return forget_tuned(shard, services.paths, services.this_machine(), services.catalog_tiers())
