"""Which tier to download for a machine: a verdict per tier, the best one, and why not the others.

Quality order (best first), the rule ``tiers`` prints, each step with its reason shown:

1. bits per weight of the routed-expert type (IQ2_XXS 2.06 > IQ1_M 1.75 > IQ1_S 1.56;
   the catalog's ``expert_quant``):
   the experts are 93-98 % of the weights, so their type decides quality;
2. the evidence behind it: a tier made without an importance matrix for a type
   llama.cpp will not make without one (IQ1_S, IQ1_M, IQ2_*, IQ3_XXS:
   ``tensor_requires_imatrix`` in ``src/llama-quant.cpp``, b11434, "The result will be
   garbage, so bailing out"), and a tier whose card measured no end-to-end quality (only
   weight-space errors, or nothing), each rank below the tiers of the same expert type
   that have them;
3. routed-expert parameters kept (experts x expert width): a pruned tier (832
   experts, or 896 narrowed experts) ranks below the full one of the same type;
4. bits per weight of everything else (attention, shared experts, ...).

Reference tiers (lossless baselines the publishers do not mean for local use)
get a verdict but are never recommended.  The recommended tier is the first in
this order whose plan keeps the whole model in memory (verdict gpu, hybrid or
cpu), except that a tier whose files are guessed (``known: false``: the card does not
list them) is passed over for a known tier of similar quality (the same bit class of
routed-expert type: 1-bit, 2-bit, 3-bit, ...) that also fits.  When none does, the
closest option is the tier that misses memory by the least (the RAM it lacks to stay
resident), named with that figure, what it would run at with that much more free RAM
and, as it is, streaming from disk.

Only tiers whose download fits the free disk of the download folder are preferred
(recommended or named the closest) when any does; when none does, the summary says
the disk first.  The summary states the pick's download size against the free disk.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from k3desk.core.catalog.model import Tier
from k3desk.core.errors import K3Error
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.k3arch import is_expert_tensor
from k3desk.core.planning.estimate import estimate_layout, ggml_type, tier_shape
from k3desk.core.planning.model import LaunchPlan, PlanOptions, VerdictKind
from k3desk.core.planning.plan import make_plan
from k3desk.core.units import fmt_bytes, fmt_tps

ORDERING_RULE = (
    "Quality order: higher routed-expert bits per weight first; within one expert type, "
    "tiers made without the importance matrix llama.cpp requires for it, or with no "
    "measured end-to-end quality, rank lower; then more routed-expert parameters (experts x "
    "width; pruned tiers rank lower), then higher bits per weight for the other weights. "
    "Reference tiers are never recommended, and a tier with guessed files is not "
    "recommended over a known one of similar quality (the same bit class of experts). "
    "Only a tier whose download fits the free disk is recommended, when any does; when none "
    "fits in memory, the closest is the one missing the least memory."
)

# The types llama-quantize refuses to make without an importance matrix
# (tensor_requires_imatrix in src/llama-quant.cpp, b11434).
IMATRIX_TYPES = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS"})


@dataclass(frozen=True)
class QualityBasis:
    """What a tier's place in the quality order rests on."""

    expert_quant: str
    expert_bits: float  # of the type (nominal), not of the file
    imatrix: bool | None  # None: the card does not say
    imatrix_required: bool  # llama.cpp will not make this expert type without one
    measured: tuple[str, ...]  # metrics of the card's end-to-end quality figures
    experts: int
    expert_width: int
    files_known: bool

    @property
    def bit_class(self) -> int:
        """1 for 1-bit types (IQ1_S, IQ1_M), 2 for IQ2_*, 3 for Q3_K, ...: 'similar quality'."""
        return int(self.expert_bits)

    @property
    def shortcomings(self) -> tuple[str, ...]:
        """What ranks it below tiers of the same expert type, in words."""
        out = []
        if self.imatrix is False and self.imatrix_required:
            out.append(
                f"made without an importance matrix, which llama.cpp requires for "
                f"{self.expert_quant} ('the result will be garbage')"
            )
        if not self.measured:
            out.append("no end-to-end quality measured by its publisher")
        return tuple(out)

    def text(self) -> str:
        """One sentence: the facts the order used."""
        parts = [f"{self.expert_quant} experts ({self.expert_bits:.3g} bpw)"]
        if self.imatrix is True:
            parts.append("with an importance matrix")
        elif self.imatrix is None:
            parts.append("importance matrix not stated")
        parts.append(
            f"{self.experts} experts of width {self.expert_width}"
            + ("" if (self.experts, self.expert_width) == (896, 3072) else " (pruned)")
        )
        if self.measured:
            parts.append("measured: " + ", ".join(self.measured[:3]))
        parts += list(self.shortcomings)
        if not self.files_known:
            parts.append("files guessed")
        return "; ".join(parts)


def quality_basis(tier: Tier) -> QualityBasis:
    return QualityBasis(
        expert_quant=tier.expert_quant,
        expert_bits=_bpw(tier.expert_quant),
        imatrix=tier.imatrix,
        imatrix_required=tier.expert_quant.upper() in IMATRIX_TYPES,
        measured=tuple(dict.fromkeys(q.metric for q in tier.measured_quality)),
        experts=tier.experts_kept,
        expert_width=tier.expert_feed_forward_length,
        files_known=tier.known,
    )

FITS: tuple[VerdictKind, ...] = ("gpu", "hybrid", "cpu")

TierVerdictKind = VerdictKind | Literal["n/a"]


# how a tier would run once it is resident, in words
RESIDENT_WORDS: dict[VerdictKind, str] = {
    "gpu": "entirely on the GPUs",
    "hybrid": "hybrid (experts partly in RAM)",
    "cpu": "from RAM (CPU only)",
}

CLOSEST_RULE = "the one missing the least memory"


@dataclass(frozen=True)
class Resident:
    """How a tier that misses memory would run with that much more free RAM: its plan
    made again for this machine with the missing bytes added (the same options)."""

    extra_ram: int  # free RAM to add
    verdict: VerdictKind  # gpu, hybrid or cpu
    expected_tps: float
    low_tps: float
    high_tps: float

    def text(self) -> str:
        """'with 294.8 GiB more free RAM it would run from RAM (CPU only) at about 1.2 tok/s'."""
        return (
            f"with {fmt_bytes(self.extra_ram)} more free RAM it would run "
            f"{RESIDENT_WORDS.get(self.verdict, self.verdict)} at about "
            f"{fmt_tps(self.expected_tps)} tok/s"
        )


@dataclass(frozen=True)
class TierVerdict:
    tier: Tier
    verdict: TierVerdictKind
    reason: str  # the plan's one sentence, or why there is no plan
    plan: LaunchPlan | None
    rank: int  # 1 = best quality
    expert_bpw: float
    other_bpw: float
    shortfall: int = 0  # RAM bytes missing for a resident model
    why_not: str = ""  # for tiers that are not the recommendation
    disk_note: str = ""  # the download does not fit the free disk: by how much, in words
    basis: QualityBasis | None = None  # what its rank rests on
    # RAM missing for the whole model to stay resident (``shortfall`` of a "no-fit" plan
    # counts only the buffers that cannot be allocated); 0 when it fits
    memory_short: int = 0
    resident: Resident | None = None  # how it would run with ``memory_short`` more RAM

    @property
    def fits(self) -> bool:
        return self.verdict in FITS

    @property
    def fits_disk(self) -> bool:
        """Its download fits the free disk (or the disk is not known)."""
        return not self.disk_note


@dataclass(frozen=True)
class Recommendation:
    best: TierVerdict | None
    # when nothing fits: the tier missing the least memory (among those whose download
    # fits the free disk, when any does)
    closest: TierVerdict | None
    verdicts: tuple[TierVerdict, ...]  # every tier, in quality order
    ordering_rule: str
    summary: str
    notes: tuple[str, ...] = ()  # other ways to run a tier on this kind of machine


def _bpw(type_name: str) -> float:
    try:
        return ggml_type(type_name).bits_per_weight
    except K3Error:
        return 0.0


def layout_bpw(layout: ModelLayout) -> tuple[float, float]:
    """(routed-expert, other) bits per weight of a layout with a tensor list."""
    e_bytes = e_n = o_bytes = o_n = 0
    for t in layout.tensors:
        n = 1
        for d in t.shape:
            n *= d
        if is_expert_tensor(t.name):
            e_bytes, e_n = e_bytes + t.nbytes, e_n + n
        else:
            o_bytes, o_n = o_bytes + t.nbytes, o_n + n
    return (8 * e_bytes / e_n if e_n else 0.0, 8 * o_bytes / o_n if o_n else 0.0)


_CARD_N = re.compile(r"--n-cpu-moe\s+(\d+)")


def card_reference(tier: Tier) -> tuple[int | None, str]:
    """The --n-cpu-moe the tier's own card runs with, if it states one."""
    for s in tier.speeds:
        if s.subject:
            continue
        m = _CARD_N.search(s.conditions)
        if m:
            return int(m.group(1)), f"The {tier.publisher} card"
    return None, ""


def options_for(tier: Tier, opts: PlanOptions) -> PlanOptions:
    """``opts`` with the tier card's --n-cpu-moe as the comparison point."""
    if opts.reference_n_cpu_moe is not None:
        return opts
    n, label = card_reference(tier)
    if n is None:
        return opts
    return replace(opts, reference_n_cpu_moe=n, reference_label=label)


def _quality_key(
    tier: Tier, expert_bpw: float, other_bpw: float
) -> tuple[float, int, int, float, int]:
    """Sort key, best first: the expert *type's* bits (not the estimate's, which a
    few Q2_K-promoted tensors or a width-pruned file would blur), the evidence's
    shortcomings, routed parameters kept, then the other weights' bits."""
    shape = tier_shape(tier)
    routed = tier.experts_kept * shape.n_ff_expert
    nominal = _bpw(tier.expert_quant) or expert_bpw
    flaws = len(quality_basis(tier).shortcomings)
    return (-round(nominal, 3), flaws, -routed, -round(other_bpw, 2), -tier.size_bytes)


def memory_short(plan: LaunchPlan) -> int:
    """RAM missing for the whole model to stay resident: the RAM side's use against its
    budget (for a "stream" plan its shortfall; for "no-fit" more than the buffers' own)."""
    ram = next((d for d in plan.devices if d.device == "RAM"), None)
    return max(0, ram.used - ram.capacity) if ram is not None else plan.shortfall


def with_more_ram(hw: HardwareProfile, extra: int) -> HardwareProfile:
    """``hw`` with ``extra`` more bytes of RAM, all of them free."""
    mem = hw.memory
    cgroup = mem.cgroup_limit + extra if mem.cgroup_limit is not None else None
    more = replace(
        mem, total=mem.total + extra, available=mem.available + extra, cgroup_limit=cgroup
    )
    return replace(hw, memory=more)


def resident_with_more_ram(
    hw: HardwareProfile, layout: ModelLayout, opts: PlanOptions, short: int
) -> Resident | None:
    """How the model would run with ``short`` more free RAM (the plan made again; a few
    more rounds if that plan still misses some), or None when it still would not fit."""
    extra = short
    for _ in range(3):
        try:
            plan = make_plan(with_more_ram(hw, extra), layout, opts)
        except K3Error:
            return None
        if plan.verdict in FITS:
            s = plan.speed
            return Resident(extra, plan.verdict, s.expected_tps, s.low_tps, s.high_tps)
        more = memory_short(plan)
        if more <= 0:
            return None
        extra += more
    return None


@dataclass(frozen=True)
class _Judged:
    verdict: TierVerdictKind
    reason: str
    plan: LaunchPlan | None
    expert_bpw: float
    other_bpw: float
    resident: Resident | None = None


def _verdict(hw: HardwareProfile, tier: Tier, opts: PlanOptions) -> _Judged:
    if "llama.cpp" not in tier.engines:
        engines = ", ".join(tier.engines)
        return _Judged("n/a", f"Runs only on {engines}; k3desk plans llama.cpp launches.", None,
                       0.0, 0.0)  # fmt: skip
    opts = options_for(tier, opts)
    try:
        layout = estimate_layout(tier)
        plan = make_plan(hw, layout, opts)
    except K3Error as exc:
        return _Judged(
            "n/a", exc.message, None, _bpw(tier.expert_quant), _bpw(tier.dense_quant)
        )
    e_bpw, o_bpw = layout_bpw(layout)
    short = memory_short(plan)
    resident = (
        resident_with_more_ram(hw, layout, opts, short)
        if plan.verdict not in FITS and short > 0
        else None
    )
    return _Judged(plan.verdict, plan.reason, plan, e_bpw, o_bpw, resident)


def _disk_note(hw: HardwareProfile, tier: Tier) -> str:
    if hw.disk is None or tier.size_bytes <= hw.disk.free:
        return ""
    return (
        f"needs {fmt_bytes(tier.size_bytes)} of disk, {hw.disk.probed_path} has "
        f"{fmt_bytes(hw.disk.free)} free"
    )


def _tier_verdict(hw: HardwareProfile, tier: Tier, opts: PlanOptions) -> TierVerdict:
    j = _verdict(hw, tier, opts)
    return TierVerdict(
        tier=tier,
        verdict=j.verdict,
        reason=j.reason,
        plan=j.plan,
        rank=0,
        expert_bpw=j.expert_bpw,
        other_bpw=j.other_bpw,
        shortfall=j.plan.shortfall if j.plan else 0,
        disk_note=_disk_note(hw, tier),
        basis=quality_basis(tier),
        memory_short=memory_short(j.plan) if j.plan is not None else 0,
        resident=j.resident,
    )


def _pick(
    eligible: list[TierVerdict],
) -> tuple[TierVerdict | None, TierVerdict | None, dict[str, TierVerdict]]:
    """(best, closest, guessed tiers passed over and for which known one), among the
    tiers whose download fits the free disk when any does (with a plan)."""
    on_disk = [v for v in eligible if v.fits_disk]
    pool = on_disk if any(v.plan is not None for v in on_disk) else eligible
    passed: dict[str, TierVerdict] = {}
    for v in pool:
        if not v.fits:
            continue
        known = _known_alternative(v, pool)
        if known is not None:
            passed[v.tier.id] = known
            continue
        return v, None, passed
    misses = [v for v in pool if v.plan is not None]
    # the least memory missing; of equals, the better quality
    closest = min(misses, key=lambda v: (v.memory_short, v.rank)) if misses else None
    return None, closest, passed


def recommend(
    hw: HardwareProfile, catalog: Iterable[Tier], opts: PlanOptions | None = None
) -> Recommendation:
    """A verdict for every tier on ``hw`` and the best-quality tier that fits."""
    opts = opts or PlanOptions()
    rows = [_tier_verdict(hw, tier, opts) for tier in catalog]
    rows.sort(key=lambda tv: _quality_key(tv.tier, tv.expert_bpw, tv.other_bpw))
    ranked = [replace(tv, rank=i + 1) for i, tv in enumerate(rows)]
    eligible = [v for v in ranked if not v.tier.reference]
    best, closest, passed = _pick(eligible)
    chosen = best or closest
    final = tuple(
        replace(v, why_not=_why_not(v, chosen, passed.get(v.tier.id), hw)) for v in ranked
    )
    best = next((v for v in final if best and v.tier.id == best.tier.id), None)
    closest = next((v for v in final if closest and v.tier.id == closest.tier.id), None)
    return Recommendation(
        best=best,
        closest=closest,
        verdicts=final,
        ordering_rule=ORDERING_RULE,
        summary=_summary(hw, best, closest, final),
        notes=_cluster_notes(hw, final),
    )


def _similar(a: TierVerdict, b: TierVerdict) -> bool:
    """Of similar quality: routed experts of the same bit class (1-bit, 2-bit, ...)."""
    return a.basis is not None and b.basis is not None and a.basis.bit_class == b.basis.bit_class


def _known_alternative(v: TierVerdict, eligible: list[TierVerdict]) -> TierVerdict | None:
    """For a fitting tier with guessed files: the best known tier of similar quality that
    fits too (then that one is recommended instead), else None."""
    if v.tier.known:
        return None
    return next((w for w in eligible if w.fits and w.tier.known and _similar(v, w)), None)


def _cluster_notes(hw: HardwareProfile, verdicts: tuple[TierVerdict, ...]) -> tuple[str, ...]:
    """GB10 nodes: the tiers SparkInfer spreads over three of them (llama.cpp plans one)."""
    if not any(g.unified_memory and "gb10" in g.name.lower() for g in hw.gpus):
        return ()
    return tuple(
        f"{_label(v)} also runs on SparkInfer across three GB10 nodes (tensor parallel, "
        "each node holding a third; the recipe claims about 113 GiB per node). "
        "This plan covers one node with llama.cpp."
        for v in verdicts
        if "sparkinfer" in v.tier.engines and not v.fits
    )


def _label(tv: TierVerdict) -> str:
    return f"{tv.tier.name} ({tv.tier.publisher})"


def _why_not(
    tv: TierVerdict,
    chosen: TierVerdict | None,
    known_instead: TierVerdict | None = None,
    hw: HardwareProfile | None = None,
) -> str:
    if chosen is not None and tv.tier.id == chosen.tier.id and tv.fits:
        return ""
    if tv.verdict == "n/a":
        return tv.reason
    if tv.tier.reference:
        return "a reference tier, not meant for local use"
    if tv.fits:
        return _why_not_fitting(tv, chosen, known_instead)
    why = f"{_label(tv)} would need {fmt_bytes(tv.memory_short or tv.shortfall)} more RAM"
    if tv.resident is not None:
        why += f"; with it, it would run {_runs(tv.resident)}"
    if tv.verdict == "stream":
        tps = tv.plan.speed.expected_tps if tv.plan else 0.0
        why += f"; streaming from disk it would run at about {fmt_tps(tps)} tok/s"
    if tv.disk_note:
        why += f"; its download {tv.disk_note}"
    return why


def _why_not_fitting(
    tv: TierVerdict, chosen: TierVerdict | None, known_instead: TierVerdict | None
) -> str:
    """Why a tier that fits in memory is not the pick."""
    if tv.disk_note and (chosen is None or chosen.fits_disk):
        return f"fits in memory, but its download {tv.disk_note}"
    if known_instead is not None:
        return (
            "fits, but its files are guessed (the card does not list them): "
            f"{_label(known_instead)} is a known tier of similar quality "
            f"({tv.basis.bit_class if tv.basis else '?'}-bit experts) that fits too"
        )
    if chosen is not None and tv.rank > chosen.rank:
        flaws = tv.basis.shortcomings if tv.basis else ()
        why = f": {'; '.join(flaws)}" if flaws else ""
        return f"fits too, but ranks lower in quality (#{tv.rank} vs #{chosen.rank}){why}"
    return "fits"


def _runs(r: Resident) -> str:
    """'from RAM (CPU only) at about 1.2 tok/s'."""
    return f"{RESIDENT_WORDS.get(r.verdict, r.verdict)} at about {fmt_tps(r.expected_tps)} tok/s"


def sentence(clause: str) -> str:
    """'Clause.' from 'clause', or '' for none."""
    return f"{clause[:1].upper()}{clause[1:]}." if clause else ""


def _sentence(clause: str) -> str:
    """' Clause.' (with a leading space), or '' for none."""
    return f" {sentence(clause)}" if clause else ""


def _summary(
    hw: HardwareProfile,
    best: TierVerdict | None,
    closest: TierVerdict | None,
    verdicts: tuple[TierVerdict, ...] = (),
) -> str:
    """The first answer: the disk first when it is what stops a download, then the pick,
    what memory it needs and at what speed, and its download against the free disk."""
    # a detected machine is the one the person sits at: "this machine", not its host name
    machine = hw.label or ("this machine" if hw.source == "detected" else hw.hostname)
    machine = machine or "this machine"
    eligible = [v for v in verdicts if not v.tier.reference and v.plan is not None]
    disk = _disk_first(hw, best or closest, eligible)
    if best is not None and best.plan is not None:
        s = best.plan.speed
        return (
            f"{disk}Recommended for {machine}: {_label(best)}, {best.verdict} "
            f"(about {fmt_tps(s.expected_tps)} tok/s, "
            f"{fmt_tps(s.low_tps)}-{fmt_tps(s.high_tps)}).{_download(hw, best)}"
            f"{_sentence(best.tier.files_guessed)}"
        )
    if closest is None:
        return f"{disk}No tier can be planned for {machine}."
    restricted = any(not v.fits_disk for v in eligible) and closest.fits_disk
    rule = ("of the tiers whose download fits the free disk, " if restricted else "") + (
        CLOSEST_RULE
    )
    # a tier that fits in memory but not on the disk was said first: none of the rest fits
    which = "No other tier" if any(v.fits for v in eligible) else "No tier"
    text = (
        f"{disk}{which} fits in the memory of {machine}. The closest ({rule}) is "
        f"{_label(closest)}: it misses RAM by {fmt_bytes(closest.memory_short)}"
    )
    r = closest.resident
    if r is not None and r.extra_ram == closest.memory_short:
        text += f"; with that much more free RAM it would run {_runs(r)}"
    elif r is not None:
        text += f"; {r.text()}"
    text += "."
    if closest.verdict == "stream" and closest.plan is not None:
        tps = fmt_tps(closest.plan.speed.expected_tps)
        text += f" As it is, it would stream experts from disk at about {tps} tok/s."
    elif closest.verdict == "no-fit":
        text += " As it is, it cannot run here, not even from disk."
    return f"{text}{_download(hw, closest)}{_sentence(closest.tier.files_guessed)}"


def _download(hw: HardwareProfile, tv: TierVerdict) -> str:
    """' Download: 307.5 GiB; /home/user has 326.0 GiB free.' ('' without a disk)."""
    if hw.disk is None:
        return ""
    return (
        f" Download: {fmt_bytes(tv.tier.size_bytes)}; {hw.disk.probed_path} has "
        f"{fmt_bytes(hw.disk.free)} free."
    )


def _disk_first(
    hw: HardwareProfile, chosen: TierVerdict | None, eligible: list[TierVerdict]
) -> str:
    """What the free disk rules out, said before the pick: that no download fits, or
    that a better tier that fits in memory does not fit on the disk ('' otherwise)."""
    if hw.disk is None or not eligible:
        return ""
    where = f"{hw.disk.probed_path} has {fmt_bytes(hw.disk.free)} free"
    if not any(v.fits_disk for v in eligible):
        smallest = min(eligible, key=lambda v: v.tier.size_bytes)
        return (
            f"No tier's download fits the free disk: {where}, and the smallest, "
            f"{_label(smallest)}, needs {fmt_bytes(smallest.tier.size_bytes)}. Free space "
            "there or choose another download folder first. "
        )
    better = next(
        (
            v
            for v in eligible
            if v.fits
            and not v.fits_disk
            and (chosen is None or not chosen.fits or v.rank < chosen.rank)
        ),
        None,
    )
    if better is None:
        return ""
    return (
        f"{_label(better)} would run here ({better.verdict}), but its download "
        f"({fmt_bytes(better.tier.size_bytes)}) does not fit the free disk: {where}. "
    )
