"""A tier: one published Kimi-K3 GGUF quantization, as its model card describes it.

The data lives in ``resources/catalog.json`` (not in code).  Figures are the
publishers' claims, kept with their measurement conditions; they are not
comparable across publishers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from huggingface_hub.utils import filter_repo_objects  # type: ignore[attr-defined]

from k3desk.core.gguf.shards import split_part_names

Engine = Literal["llama.cpp", "sparkinfer", "vllm"]
# The llama.cpp forks k3desk builds for images (``k3desk engine install --source NAME``):
# a tier's ``vision_engine`` is one of them.  k3desk.core.engines.source.FORKS gives
# each its repository and ref, under exactly these names.
KNOWN_FORKS: tuple[str, ...] = ("unsloth", "atomicchat")
VisionSupport = Literal["upstream", "fork", "none"]

# The k3arch roles a tier's ``tensor_types`` must cover (see k3desk.core.k3arch.Role).
ROLES: tuple[str, ...] = (
    "token_embd",
    "output",
    "norm",
    "router",
    "conv",
    "odd_row",
    "attn",
    "dense_ffn",
    "shexp",
    "latent",
    "experts",
)


QualityScope = Literal["end-to-end", "weight-space"]


@dataclass(frozen=True)
class QualityFigure:
    metric: str  # e.g. "PPL", "Top-1 vs Q8_0", "HumanEval"
    value: str  # as published, e.g. "5.3610 ± 0.02917"
    conditions: str  # corpus, chunks, n_ctx, reference model, ...
    # "end-to-end": measured on the model's output (perplexity, KL divergence, top-1,
    # benchmarks); "weight-space": only how close quantized tensors are to the source
    scope: QualityScope = "end-to-end"


@dataclass(frozen=True)
class SpeedReport:
    tokens_per_s: float
    kind: Literal["decode", "prefill"]
    hardware: str  # as described by the card
    engine: str
    conditions: str = ""
    # True = measured by the publisher on the stated hardware; False = a third-party
    # report nobody reproduced (or one whose exact file revision is unknown).
    verified: bool = False
    # The file that was measured, when it is not this tier's own (e.g. a comparison
    # figure a card quotes for a related artifact).  Empty = this tier.
    subject: str = ""


@dataclass(frozen=True)
class TensorOverride:
    """A per-tensor exception to ``tensor_types`` (regex fully matching the tensor name)."""

    pattern: str
    type: str
    note: str = ""

    def matches(self, tensor_name: str) -> bool:
        return re.fullmatch(self.pattern, tensor_name) is not None


@dataclass(frozen=True)
class Tier:
    id: str  # stable, e.g. "6block-iq1s-xs"
    publisher: str  # Hub user/org
    name: str  # display name, e.g. "IQ1_S-XS"
    repo: str  # Hub repo id
    # allow_patterns for the text shards (exactly as hf download --include)
    include: tuple[str, ...]
    first_shard: str  # repo path of part 1 (what -m takes, relative to the download dir)
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
    # --- additions (all optional, so older consumers keep working) ---
    source: str = ""  # where the facts come from (model card address)
    size_exact: bool = True  # False: size_bytes is the card's rounded figure converted
    # fields whose values we derived rather than read from the card (see caveats)
    derived: tuple[str, ...] = ()
    # routed-expert FFN width; 3072 in Kimi-K3, narrower in width-pruned files
    expert_feed_forward_length: int = 3072
    tensor_overrides: tuple[TensorOverride, ...] = ()
    tensor_types_note: str = ""  # which of tensor_types the card states, which are assumed
    # vision: the llama.cpp fork its card builds for images (a k3desk engine source, e.g.
    # "unsloth", "atomicchat"), and the projector type of its mmproj (clip.projector_type;
    # "" when no source says)
    vision_engine: str = ""
    mmproj_type: str = ""

    @property
    def files_guessed(self) -> str:
        """Why this tier's files are a guess, as a clause ("its files are guessed: ..."),
        or '' when the card lists them."""
        if self.known:
            return ""
        what = [f for f in ("repo", "include", "first_shard", "shard_count") if f in self.derived]
        names = {
            "repo": "repository",
            "include": "file pattern",
            "first_shard": "file names",
            "shard_count": "shard count",
        }
        guessed = ", ".join(names[f] for f in what) or "files and sizes"
        return (
            f"its files are guessed: the card does not list them ({guessed} derived); check "
            "the repository listing before downloading"
        )

    @property
    def measured_quality(self) -> tuple[QualityFigure, ...]:
        """The card's end-to-end quality figures (not weight-space reconstruction errors)."""
        return tuple(q for q in self.quality if q.scope == "end-to-end")

    # ------------------------------------------------------------ file selection
    def matches(self, filename: str) -> bool:
        """True if ``filename`` (a repo path) is one of this tier's text shards."""
        return any(True for _ in filter_repo_objects([filename], allow_patterns=list(self.include)))

    def download_patterns(self, with_mmproj: bool = False) -> list[str]:
        """The ``--include`` patterns to fetch this tier (plus its projector files)."""
        patterns = list(self.include) + list(self.extra_files)
        if with_mmproj:
            patterns += list(self.mmproj)
        return patterns

    def select_files(self, names: Iterable[str], with_mmproj: bool = False) -> list[str]:
        """The subset of repo paths ``names`` this tier downloads, in the given order.

        Same semantics as ``hf download --include`` / ``snapshot_download(allow_patterns=)``:
        fnmatch, case-sensitive, ``*`` also matches ``/``.
        """
        patterns = self.download_patterns(with_mmproj)
        return list(filter_repo_objects(list(names), allow_patterns=patterns))

    def shard_names(self) -> list[str]:
        """Repo paths of every text shard, derived from ``first_shard`` and ``shard_count``."""
        return split_part_names(self.first_shard)

    def type_for(self, tensor_name: str, role: str) -> str:
        """The ggml type name this tier stores ``tensor_name`` (of k3arch ``role``) in."""
        for override in self.tensor_overrides:
            if override.matches(tensor_name):
                return override.type
        return self.tensor_types[role]
