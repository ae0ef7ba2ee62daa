"""Use-case "judge the tiers for hardware H": the rows every shell shows, computed once.

The wizard's fit chart, the tiers table (wizard and Models page) and ``k3desk tiers``
(text and ``--json``) all render a :class:`TierJudgement`; none of them derives a
figure of its own.  Each :class:`TierRow` carries the verdict in one vocabulary
(:func:`verdict_label`), the RAM shortfall, the speed range (only for tiers that
run), the ``--n-cpu-moe`` value and the number of expert layers it keeps on the CPU,
and what the tier needs of each resource against what the plan may use there
(:class:`Need`): the RAM bar's shortfall is the plan's shortfall, to the byte.

The verdicts and the recommendation come from the planner
(:func:`k3desk.core.planning.recommend.recommend`); this module only reads them.
With the app's state folder (``TierRequest.state_dir``), a row's speed carries
this machine's correction from its own runs (``core/tuning/calibration.py``): the
runs of that tier's model where it was run here, else those of the same kind of
plan, shown beside the model's own figure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from k3desk.core.app.subject import Subject
from k3desk.core.catalog.model import Tier
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.kernels import KernelScale
from k3desk.core.planning.model import DEFAULT_CTX, LaunchPlan, PlanOptions
from k3desk.core.planning.recommend import (
    FITS,
    QualityBasis,
    Recommendation,
    TierVerdict,
    TierVerdictKind,
    recommend,
    sentence,
)
from k3desk.core.tuning.calibration import CalibrationStore, Correction, describe
from k3desk.core.tuning.cpuprobe import kept_scale
from k3desk.core.units import fmt_bytes, fmt_tps

Resource = Literal["VRAM", "RAM", "Disk"]

# verdicts with a speed: the model runs (from memory, or reading experts from disk)
RUNS: tuple[TierVerdictKind, ...] = (*FITS, "stream")


@dataclass(frozen=True)
class Need:
    """What a tier needs of one resource (bytes), against what the plan may use there.

    ``have`` is the budget after the margins the planner keeps free (1 GiB per GPU,
    RAM for the system), so ``short`` is exactly what the plan misses.
    """

    resource: Resource
    need: int
    have: int

    @property
    def fits(self) -> bool:
        return self.need <= self.have

    @property
    def short(self) -> int:
        return max(0, self.need - self.have)

    @property
    def fraction(self) -> float:
        return self.need / self.have if self.have > 0 else (1.0 if self.need else 0.0)

    def text(self) -> str:
        """'RAM 120.4 GiB / 1.9 TiB', or 'RAM: 292.0 GiB short'."""
        if self.fits:
            return f"{self.resource} {fmt_bytes(self.need)} / {fmt_bytes(self.have)}"
        return f"{self.resource}: {fmt_bytes(self.short)} short"


@dataclass(frozen=True)
class SpeedRange:
    """The planner's decode-speed prediction, as every shell states it."""

    expected: float
    low: float
    high: float
    bottleneck: str
    # the prediction with this machine's correction (0: no runs here to correct it by)
    here: float = 0.0
    calibration: str = ""  # what the correction rests on, in words

    def text(self) -> str:
        """'13 tok/s', or '13 tok/s (here ~9.1)' with this machine's correction."""
        text = f"{fmt_tps(self.expected)} tok/s"
        if self.here > 0:
            text += f" (here ~{fmt_tps(self.here)})"
        return text

    def range_text(self) -> str:
        """'9.9-18 tok/s'."""
        return f"{fmt_tps(self.low)}-{fmt_tps(self.high)} tok/s"

    def details(self) -> str:
        """The range, the bottleneck and, on a line of its own, this machine's correction."""
        text = f"{self.range_text()}; bottleneck: {self.bottleneck}"
        if self.calibration:
            text += f"\n{sentence(self.calibration)}"
        return text


@dataclass(frozen=True)
class TierRow:
    """One tier judged for one machine."""

    verdict: TierVerdict  # the planner's own (tier, plan, reason, why not, rank)
    label: str  # the verdict in words (:func:`verdict_label`)
    recommended: bool  # the pick: the recommendation, else the closest option
    shortfall: int  # RAM bytes missing for a resident model (0 when it fits)
    stream_bytes: int  # expert bytes read from disk per pass ("stream")
    speed: SpeedRange | None  # None for a tier that cannot run
    n_cpu_moe: int | None  # the --n-cpu-moe value of the plan
    expert_layers_on_cpu: int | None  # layers whose routed experts stay in RAM
    expert_layers_on_gpu: int | None
    needs: tuple[Need, ...]  # VRAM (when the machine has any), RAM, disk

    @property
    def tier(self) -> Tier:
        return self.verdict.tier

    @property
    def kind(self) -> TierVerdictKind:
        return self.verdict.verdict

    @property
    def plan(self) -> LaunchPlan | None:
        return self.verdict.plan

    @property
    def fits(self) -> bool:
        return self.verdict.fits

    @property
    def runs(self) -> bool:
        return self.kind in RUNS

    def need(self, resource: Resource) -> Need | None:
        return next((n for n in self.needs if n.resource == resource), None)

    @property
    def basis(self) -> QualityBasis | None:
        """What the tier's rank rests on (the planner's, see :class:`QualityBasis`)."""
        return self.verdict.basis

    @property
    def basis_text(self) -> str:
        """'IQ1_S experts (1.56 bpw); ...; files guessed', or '' when there is none."""
        return self.basis.text() if self.basis is not None else ""

    @property
    def files_guessed(self) -> str:
        """Why the tier's files are a guess, as a clause, or '' when the card lists them."""
        return self.tier.files_guessed

    @property
    def files_note(self) -> str:
        """The same as a sentence ("Its files are guessed: ... ."), or ''."""
        return files_note(self.tier)


@dataclass(frozen=True)
class TierJudgement:
    """Every catalog tier judged for one machine, in quality order, and the pick."""

    subject: Subject
    hardware: HardwareProfile
    recommendation: Recommendation
    rows: tuple[TierRow, ...]

    @property
    def summary(self) -> str:
        return self.recommendation.summary

    @property
    def ordering_rule(self) -> str:
        return self.recommendation.ordering_rule

    @property
    def notes(self) -> tuple[str, ...]:
        return self.recommendation.notes

    @property
    def best(self) -> TierRow | None:
        best = self.recommendation.best
        return self.row(best.tier.id) if best is not None else None

    @property
    def closest(self) -> TierRow | None:
        closest = self.recommendation.closest
        return self.row(closest.tier.id) if closest is not None else None

    @property
    def chosen(self) -> TierRow | None:
        """The row every shell preselects: the recommendation, else the closest option."""
        return self.best or self.closest

    def row(self, tier_id: str) -> TierRow | None:
        return next((r for r in self.rows if r.tier.id == tier_id), None)


@dataclass(frozen=True)
class TierRequest:
    """What to judge the tiers for, and with which options."""

    hardware: HardwareProfile
    subject: Subject
    ctx: int = DEFAULT_CTX  # the context size every plan is made for
    temperature: float = 1.0  # these two only shape the plans' llama-server arguments
    top_p: float = 0.95
    # the app's state folder: speeds corrected by this machine's runs (None: as predicted)
    state_dir: Path | None = None

    def options(self, kernel_scale: KernelScale | None = None) -> PlanOptions:
        """The plans' options (``kernel_scale``: this CPU's kernel speed where it was
        checked, ``core/tuning/cpuprobe.py``)."""
        return PlanOptions(
            ctx=self.ctx, temperature=self.temperature, top_p=self.top_p, kernel_scale=kernel_scale
        )


def judge_tiers(request: TierRequest, tiers: Iterable[Tier]) -> TierJudgement:
    """Every tier in ``tiers`` judged for ``request.hardware`` (see the module docstring)."""
    hw = request.hardware
    scale, since = kept_scale(request.state_dir, hw)
    rec = recommend(hw, tiers, request.options(scale))
    chosen = rec.best or rec.closest
    store = CalibrationStore(request.state_dir) if request.state_dir is not None else None
    rows = tuple(
        tier_row(
            tv,
            hw,
            recommended=chosen is not None and tv.tier.id == chosen.tier.id,
            correction=(
                store.tier_correction(hw, tv.tier.first_shard, tv.plan.verdict, since)
                if store is not None and tv.plan is not None
                else None
            ),
        )
        for tv in rec.verdicts
    )
    return TierJudgement(request.subject, hw, rec, rows)


def tier_row(
    tv: TierVerdict,
    hw: HardwareProfile,
    *,
    recommended: bool = False,
    correction: Correction | None = None,
) -> TierRow:
    """The row for one planner verdict on ``hw`` (its speed with ``correction``)."""
    plan = tv.plan
    on_cpu = on_gpu = None
    if plan is not None:
        on_cpu = sum(1 for p in plan.layers if p.expert_device == "RAM")
        on_gpu = sum(1 for p in plan.layers if p.expert_device.startswith("CUDA"))
    speed = None
    if plan is not None and tv.verdict in RUNS:
        s = plan.speed
        here, why = 0.0, ""
        if correction is not None and correction.known:
            here, why = s.expected_tps * correction.decode_factor, describe(s, correction)
        speed = SpeedRange(s.expected_tps, s.low_tps, s.high_tps, s.bottleneck, here, why)
    return TierRow(
        verdict=tv,
        label=verdict_label(tv, on_cpu),
        recommended=recommended,
        shortfall=tv.shortfall,
        stream_bytes=plan.stream_bytes if plan is not None else 0,
        speed=speed,
        n_cpu_moe=plan.n_cpu_moe if plan is not None else None,
        expert_layers_on_cpu=on_cpu,
        expert_layers_on_gpu=on_gpu,
        needs=needs(tv, hw),
    )


def files_note(tier: Tier) -> str:
    """Why ``tier``'s files are a guess, as a sentence, or '' when its card lists them
    (for a cluster's rows too)."""
    return sentence(tier.files_guessed)


def verdict_label(tv: TierVerdict, expert_layers_on_cpu: int | None = None) -> str:
    """The verdict of a tier in the words every shell uses (see :func:`label`)."""
    return label(tv.verdict, tv.plan, tv.shortfall, tv.reason, expert_layers_on_cpu)


def label(
    kind: TierVerdictKind,
    plan: LaunchPlan | None,
    shortfall: int = 0,
    reason: str = "",
    expert_layers_on_cpu: int | None = None,
) -> str:
    """A verdict in the words every shell uses: 'GPU: everything on the GPUs',
    'hybrid: 45 expert layers on CPU', 'CPU only', 'streams from disk: 292.0 GiB beyond
    RAM' (it runs, slowly: serve launches it once accepted), "won't fit: 2.5 GiB short of
    RAM" (the buffers llama.cpp allocates do not fit), 'n/a: <why>'.

    ``hybrid`` counts the layers whose experts stay in RAM, not the ``--n-cpu-moe``
    value: ``--n-cpu-moe N`` keeps the experts of layers ``0..N-1`` on the CPU, and
    layer 0 is dense (no routed experts), so ``--n-cpu-moe 46`` moves 45 layers.
    """
    if kind == "gpu":
        return "GPU: everything on the GPUs"
    if kind == "hybrid" and plan is not None:
        n = expert_layers_on_cpu
        if n is None:
            n = sum(1 for p in plan.layers if p.expert_device == "RAM")
        return f"hybrid: {n} expert layer{'s' if n != 1 else ''} on CPU"
    if kind == "cpu":
        return "CPU only"
    if kind == "stream":
        streamed = plan.stream_bytes if plan is not None else shortfall
        return f"streams from disk: {fmt_bytes(streamed)} beyond RAM"
    if kind == "no-fit":
        return f"won't fit: {fmt_bytes(shortfall)} short of RAM"
    return f"n/a: {reason}" if reason else "n/a"


def plan_label(plan: LaunchPlan) -> str:
    """The verdict of one launch plan, in the same words as a tier's."""
    return label(plan.verdict, plan, plan.shortfall, plan.reason)


def needs(tv: TierVerdict, hw: HardwareProfile) -> tuple[Need, ...]:
    """VRAM, RAM and disk: what the tier's plan uses against what it may use there.

    VRAM (only on a machine with discrete GPUs): the GPUs' planned use against their
    budgets; a plan that uses no GPU shows the GPUs' total.  RAM: the RAM side of the
    plan against its budget; on unified memory (GB10) the GPU's share of the one pool
    counts on both sides, so the bar shows the whole pool.  Disk: the tier's files
    against the free space of the download folder.
    """
    out: list[Need] = []
    plan = tv.plan
    if plan is not None:
        unified = {f"CUDA{i}" for i, g in enumerate(hw.gpus) if g.unified_memory}
        gpus = [d for d in plan.devices if d.device != "RAM" and d.device not in unified]
        shared = [d for d in plan.devices if d.device in unified]
        if hw.total_vram > 0:
            if gpus:
                out.append(Need("VRAM", sum(d.used for d in gpus), sum(d.capacity for d in gpus)))
            else:
                out.append(Need("VRAM", 0, hw.total_vram))
        ram = next(d for d in plan.devices if d.device == "RAM")
        pooled = sum(d.used for d in shared)
        out.append(Need("RAM", ram.used + pooled, ram.capacity + pooled))
    if hw.disk is not None:
        out.append(Need("Disk", tv.tier.size_bytes, hw.disk.free))
    return tuple(out)
