"""A tier: one published Kimi-K3 GGUF quantization, as its model card describes it.

The data lives in ``resources/catalog.json`` (not in code).  Figures are the
publishers' claims, kept with their measurement conditions; they are not
comparable across publishers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Engine = Literal["llama.cpp", "sparkinfer", "vllm"]
VisionSupport = Literal["upstream", "fork", "none"]


@dataclass(frozen=True)
class QualityFigure:
    metric: str  # e.g. "PPL", "Top-1 vs Q8_0", "HumanEval"
    value: str  # as published, e.g. "5.3610 ± 0.02917"
    conditions: str  # corpus, chunks, n_ctx, reference model, ...


@dataclass(frozen=True)
class SpeedReport:
    tokens_per_s: float
    kind: Literal["decode", "prefill"]
    hardware: str  # as described by the card
    engine: str
    conditions: str = ""
    verified: bool = False  # False = third-party or unreproduced claim


@dataclass(frozen=True)
class Tier:
    id: str  # stable, e.g. "6block-iq1s-xs"
    publisher: str  # Hub user/org
    name: str  # display name, e.g. "IQ1_S-XS"
    repo: str  # Hub repo id
    include: tuple[str, ...]  # allow_patterns for the text shards (exactly as hf download --include)
    first_shard: str  # file name of part 1 (what -m takes)
    shard_count: int
    size_bytes: int  # published total of the text shards, exact bytes where known
    size_text: str  # as the card states it, e.g. "539.7 GiB"
    experts_kept: int  # 896, or 832 for the pruned tier
    expert_quant: str
    dense_quant: str
    imatrix: bool | None  # None = the card does not say
    # ggml type name per k3arch Role (e.g. {"experts": "IQ1_S", "attn": "Q4_K", ...}),
    # as the card states or as our best reading of it; twins and estimates use it
    tensor_types: dict[str, str]
    mmproj: tuple[str, ...]  # projector files in the repo (may be empty)
    vision: VisionSupport
    vision_note: str
    engines: tuple[Engine, ...]
    extra_files: tuple[str, ...] = ()  # chat template, manifest.json, ...
    manifest: str = ""  # per-file size+sha256 manifest, when the repo has one
    quality: tuple[QualityFigure, ...] = ()
    quality_caveat: str = ""
    speeds: tuple[SpeedReport, ...] = ()
    caveats: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()  # e.g. ("--no-warmup",)
    card_errata: tuple[str, ...] = ()  # where the card's own instructions are wrong
    reference: bool = False  # a reference/lossless tier, not meant for local use
    known: bool = True  # False when the card lists it without exact files/sizes
    tags: tuple[str, ...] = field(default_factory=tuple)
