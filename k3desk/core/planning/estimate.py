"""Estimate a tier's tensor layout before its files are on disk.

``tiers`` and ``recommend`` need a verdict for tiers nobody has downloaded yet.
The tensor list is known exactly (:mod:`k3desk.core.k3arch`), the tier states
the ggml type of each role, so the bytes of every tensor follow from the ggml
type table (:mod:`k3desk.core.gguf.ggml`).  What the card does not say exactly is the per-layer
type mix of the routed experts (llama.cpp's IQ1_S safeguards promote some
``ffn_down_exps`` to Q2_K; "dynamic" quants mix types per layer; pruned files
drop experts or narrow them).  The routed experts hold 81-98 % of the bytes,
so the difference between the computed total and the published size is put on
them: every expert tensor is scaled by one factor so the total matches the
published size exactly.  Non-expert tensors keep their computed sizes, which
matters because they are read in full for every token.
"""

from __future__ import annotations

import math
from pathlib import Path

from k3desk.core.catalog.model import Tier
from k3desk.core.errors import PlanError
from k3desk.core.gguf.ggml import BY_NAME, GGMLType
from k3desk.core.gguf.model import ModelLayout, TensorEntry, hparams_from_shape, layer_layouts
from k3desk.core.k3arch import REAL_K3, K3Shape, Role, TensorSpec, tensor_specs

# Roles whose type a card rarely states: llama.cpp's own rules keep them here.
_DEFAULT_TYPES: dict[str, str] = {
    "norm": "F32",
    "router": "F32",
    "conv": "F32",
    "odd_row": "F16",
}


def ggml_type(name: str, where: str = "") -> GGMLType:
    """The ggml type called ``name`` ("IQ1_S", "q4_k", ...), or a PlanError naming ``where``."""
    try:
        return BY_NAME[name.strip().upper()]
    except KeyError:
        known = ", ".join(BY_NAME)
        raise PlanError(
            f"Unknown ggml type {name!r}{' in ' + where if where else ''}.",
            f"Use one of: {known}.",
        ) from None


def tensor_nbytes(shape: tuple[int, ...], qtype: GGMLType) -> int:
    """Bytes of a tensor of ``shape`` (ggml order) stored as ``qtype``."""
    return qtype.nbytes(math.prod(shape))


def storable_type(shape: tuple[int, ...], qtype: GGMLType) -> GGMLType:
    """``qtype`` if a row of ``shape`` is a whole number of its blocks, else llama.cpp's fallback.

    llama-quantize falls back to a type with a smaller block when the row length
    (ne0) is not a multiple of the block; Q8_0 (32) when that divides, else F16.
    """
    if shape[0] % qtype.block_size == 0:
        return qtype
    if shape[0] % 32 == 0:
        return BY_NAME["Q8_0"]
    return BY_NAME["F16"]


def tier_shape(tier: Tier) -> K3Shape:
    """The Kimi-K3 shape of ``tier``: the real model with its expert count and width."""
    width = tier.expert_feed_forward_length or REAL_K3.n_ff_expert
    return REAL_K3.with_experts(tier.experts_kept, width)


def _type_name(tier: Tier, spec: TensorSpec) -> str:
    try:
        return tier.type_for(spec.name, spec.role)
    except KeyError:
        pass
    if spec.role in tier.tensor_types:
        return tier.tensor_types[spec.role]
    if spec.role in _DEFAULT_TYPES:
        return _DEFAULT_TYPES[spec.role]
    if spec.role == "experts":
        return tier.expert_quant
    return tier.dense_quant


def _shard_paths(tier: Tier) -> tuple[Path, ...]:
    return tuple(Path(n) for n in tier.shard_names())


def estimate_layout(tier: Tier) -> ModelLayout:
    """A :class:`ModelLayout` for ``tier`` whose total equals its published size."""
    if tier.experts_kept <= 0 or tier.experts_kept < REAL_K3.n_expert_used:
        raise PlanError(
            f"Tier {tier.id} keeps {tier.experts_kept} experts; Kimi-K3 routes each token "
            f"to {REAL_K3.n_expert_used}, so at least that many must be present.",
            "Fix experts_kept for this tier in the catalog.",
        )
    shape = tier_shape(tier)
    specs = list(tensor_specs(shape))
    types: list[GGMLType] = []
    raw: list[int] = []
    for spec in specs:
        qtype = storable_type(spec.shape, ggml_type(_type_name(tier, spec), f"tier {tier.id}"))
        types.append(qtype)
        raw.append(tensor_nbytes(spec.shape, qtype))

    expert_raw = sum(b for b, s in zip(raw, specs, strict=True) if s.role == "experts")
    other_raw = sum(raw) - expert_raw
    target = tier.size_bytes
    sizes = list(raw)
    if target > 0:
        if target > other_raw and expert_raw > 0:
            factor = (target - other_raw) / expert_raw
            sizes = [
                round(b * factor) if s.role == "experts" else b
                for b, s in zip(raw, specs, strict=True)
            ]
        else:  # the published size is below the non-expert estimate: scale everything
            factor = target / sum(raw)
            sizes = [round(b * factor) for b in raw]
        # put the rounding remainder on the largest tensor so the total is exact
        biggest = max(range(len(sizes)), key=lambda i: sizes[i])
        sizes[biggest] += target - sum(sizes)

    return _assemble(tier, shape, specs, types, sizes)


def _assemble(
    tier: Tier,
    shape: K3Shape,
    specs: list[TensorSpec],
    types: list[GGMLType],
    sizes: list[int],
) -> ModelLayout:
    parts = _shard_paths(tier)
    total = sum(sizes)
    per_part = max(1, -(-total // len(parts)))
    entries: list[TensorEntry] = []
    expert = [0] * shape.n_layer
    other = [0] * shape.n_layer
    global_bytes = 0
    token_embd = 0
    type_counts: dict[str, int] = {}
    offset = 0
    for spec, qtype, nbytes in zip(specs, types, sizes, strict=True):
        part = min(len(parts) - 1, offset // per_part)
        entries.append(
            TensorEntry(spec.name, spec.shape, qtype.id, qtype.name, offset, nbytes, part)
        )
        offset += nbytes
        type_counts[qtype.name] = type_counts.get(qtype.name, 0) + 1
        role: Role = spec.role
        if spec.layer is None:
            global_bytes += nbytes
            if role == "token_embd":
                token_embd += nbytes
        elif role == "experts":
            expert[spec.layer] += nbytes
        else:
            other[spec.layer] += nbytes
    layers = layer_layouts(shape, expert, other)
    base = total // len(parts)
    part_sizes = tuple(
        base + (total - base * len(parts) if i == 0 else 0) for i in range(len(parts))
    )
    return ModelLayout(
        architecture="kimi-k3",
        parts=parts,
        part_sizes=part_sizes,
        hparams=hparams_from_shape(shape),
        layers=layers,
        global_bytes=global_bytes,
        token_embd_bytes=token_embd,
        tensor_count=len(specs),
        type_counts=type_counts,
        name=f"{tier.publisher} {tier.name} (estimated from the catalog)",
        tensors=tuple(entries),
    )
