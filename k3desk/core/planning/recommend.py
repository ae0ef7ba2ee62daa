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
routed-expert type: 1-bit, 2-bit, 3-bit, ...) that also fits; when none does, the one
that would stream fastest from disk is named as the closest option, with how much RAM
it misses.
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
    "recommended over a known one of similar quality (the same bit class of experts)."
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
    disk_note: str = ""
    basis: QualityBasis | None = None  # what its rank rests on

    @property
    def fits(self) -> bool:
        return self.verdict in FITS


@dataclass(frozen=True)
class Recommendation:
    best: TierVerdict | None
    closest: TierVerdict | None  # when nothing fits: the fastest streaming option
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


def _verdict(
    hw: HardwareProfile, tier: Tier, opts: PlanOptions
) -> tuple[TierVerdictKind, str, LaunchPlan | None, float, float]:
    if "llama.cpp" not in tier.engines:
        engines = ", ".join(tier.engines)
        return "n/a", f"Runs only on {engines}; k3desk plans llama.cpp launches.", None, 0.0, 0.0
    try:
        layout = estimate_layout(tier)
        plan = make_plan(hw, layout, options_for(tier, opts))
    except K3Error as exc:
        return "n/a", exc.message, None, _bpw(tier.expert_quant), _bpw(tier.dense_quant)
    e_bpw, o_bpw = layout_bpw(layout)
    return plan.verdict, plan.reason, plan, e_bpw, o_bpw


def recommend(
    hw: HardwareProfile, catalog: Iterable[Tier], opts: PlanOptions | None = None
) -> Recommendation:
    """A verdict for every tier on ``hw`` and the best-quality tier that fits."""
    opts = opts or PlanOptions()
    rows: list[tuple[tuple[float, int, int, float, int], TierVerdict]] = []
    for tier in catalog:
        verdict, reason, plan, e_bpw, o_bpw = _verdict(hw, tier, opts)
        disk_note = ""
        if hw.disk is not None and tier.size_bytes > hw.disk.free:
            disk_note = (
                f"needs {fmt_bytes(tier.size_bytes)} of disk, {hw.disk.probed_path} has "
                f"{fmt_bytes(hw.disk.free)} free"
            )
        tv = TierVerdict(
            tier=tier,
            verdict=verdict,
            reason=reason,
            plan=plan,
            rank=0,
            expert_bpw=e_bpw,
            other_bpw=o_bpw,
            shortfall=plan.shortfall if plan else 0,
            disk_note=disk_note,
            basis=quality_basis(tier),
        )
        rows.append((_quality_key(tier, e_bpw, o_bpw), tv))
    rows.sort(key=lambda r: r[0])
    ranked = [replace(tv, rank=i + 1) for i, (_, tv) in enumerate(rows)]

    eligible = [v for v in ranked if not v.tier.reference]
    passed: dict[str, TierVerdict] = {}  # guessed tiers passed over, and for which known one
    best = None
    for v in eligible:
        if not v.fits:
            continue
        known = _known_alternative(v, eligible)
        if known is not None:
            passed[v.tier.id] = known
            continue
        best = v
        break
    closest = None
    if best is None:
        streaming = [v for v in eligible if v.verdict == "stream" and v.plan is not None]
        if streaming:
            closest = max(streaming, key=lambda v: v.plan.speed.expected_tps if v.plan else 0.0)
        else:
            misses = [v for v in eligible if v.plan is not None]
            closest = min(misses, key=lambda v: v.shortfall) if misses else None

    chosen = best or closest
    final = tuple(replace(v, why_not=_why_not(v, chosen, passed.get(v.tier.id))) for v in ranked)
    best = next((v for v in final if best and v.tier.id == best.tier.id), None)
    closest = next((v for v in final if closest and v.tier.id == closest.tier.id), None)
    return Recommendation(
        best=best,
        closest=closest,
        verdicts=final,
        ordering_rule=ORDERING_RULE,
        summary=_summary(hw, best, closest),
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
    tv: TierVerdict, chosen: TierVerdict | None, known_instead: TierVerdict | None = None
) -> str:
    if chosen is not None and tv.tier.id == chosen.tier.id and tv.fits:
        return ""
    if tv.verdict == "n/a":
        return tv.reason
    if tv.tier.reference:
        return "a reference tier, not meant for local use"
    if tv.fits:
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
    if tv.verdict == "stream":
        tps = tv.plan.speed.expected_tps if tv.plan else 0.0
        return (
            f"{_label(tv)} would need {fmt_bytes(tv.shortfall)} more RAM; "
            f"streaming from disk it would run at about {fmt_tps(tps)} tok/s"
        )
    return f"{_label(tv)} would need {fmt_bytes(tv.shortfall)} more RAM"


def sentence(clause: str) -> str:
    """'Clause.' from 'clause', or '' for none."""
    return f"{clause[:1].upper()}{clause[1:]}." if clause else ""


def _sentence(clause: str) -> str:
    """' Clause.' (with a leading space), or '' for none."""
    return f" {sentence(clause)}" if clause else ""


def _summary(hw: HardwareProfile, best: TierVerdict | None, closest: TierVerdict | None) -> str:
    # a detected machine is the one the person sits at: "this machine", not its host name
    machine = hw.label or ("this machine" if hw.source == "detected" else hw.hostname)
    machine = machine or "this machine"
    if best is not None and best.plan is not None:
        s = best.plan.speed
        guessed = _sentence(best.tier.files_guessed)
        return (
            f"Recommended for {machine}: {_label(best)}, {best.verdict} "
            f"(about {fmt_tps(s.expected_tps)} tok/s, "
            f"{fmt_tps(s.low_tps)}-{fmt_tps(s.high_tps)}).{guessed}"
        )
    if closest is not None:
        guessed = _sentence(closest.tier.files_guessed)
        if closest.verdict == "stream" and closest.plan is not None:
            return (
                f"No tier fits in the memory of {machine}. The closest is {_label(closest)}: "
                f"it misses RAM by {fmt_bytes(closest.shortfall)} and would stream experts "
                f"from disk at about {fmt_tps(closest.plan.speed.expected_tps)} tok/s.{guessed}"
            )
        return (
            f"No tier fits in the memory of {machine}. The closest is {_label(closest)}, "
            f"which misses by {fmt_bytes(closest.shortfall)}.{guessed}"
        )
    return f"No tier can be planned for {machine}."
