"""What k3desk knows about a Kimi-K3 GGUF shard set after reading its headers.

Produced by :func:`k3desk.core.gguf.validate.validate_shard_set` (header-only
reads) and consumed by planning.  Sizes are bytes of tensor data as stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from k3desk.core.k3arch import K3Shape

AttentionKind = Literal["kda", "mla"]
FfnKind = Literal["dense", "moe"]


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]  # ggml order (ne0 first)
    ggml_type: int
    type_name: str  # e.g. "IQ1_S", "Q4_K", "F32"
    offset: int  # absolute byte offset in its part
    nbytes: int
    part: int  # 0-based part index


@dataclass(frozen=True)
class LayerLayout:
    index: int
    attention: AttentionKind
    ffn: FfnKind
    # routed expert tensors: ffn_{gate,up,down}_exps (what --n-cpu-moe moves to CPU)
    expert_bytes: int
    # everything else in blk.<index>.* (attention, norms, router, shared expert, latent MoE)
    other_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.expert_bytes + self.other_bytes


def layer_layouts(
    shape: K3Shape, expert_bytes: Sequence[int], other_bytes: Sequence[int]
) -> tuple[LayerLayout, ...]:
    """One :class:`LayerLayout` per block, from the bytes of its routed experts and of the
    rest (the leading ``shape.n_dense_lead`` blocks are dense, the others MoE)."""
    return tuple(
        LayerLayout(
            index=i,
            attention="mla" if shape.is_mla(i) else "kda",
            ffn="dense" if i < shape.n_dense_lead else "moe",
            expert_bytes=expert,
            other_bytes=other,
        )
        for i, (expert, other) in enumerate(zip(expert_bytes, other_bytes, strict=True))
    )


@dataclass(frozen=True)
class K3HParams:
    """Hyper-parameters read from the ``kimi-k3.*`` keys."""

    context_length: int
    embedding_length: int
    block_count: int
    head_count: int
    head_count_kv: tuple[int, ...]  # per layer: 0 = KDA (linear) layer, >0 = MLA layer
    kv_lora_rank: int
    key_length_mla: int
    value_length_mla: int
    rope_dimension_count: int
    ssm_conv_kernel: int
    kda_head_dim: int
    expert_count: int
    expert_used_count: int
    expert_feed_forward_length: int
    expert_shared_count: int
    expert_latent_length: int
    leading_dense_block_count: int
    vocab_size: int
    # kimi-k3.attn_res.block_size: the AttnRes stack banks a checkpoint every this-many
    # layers (0 = no cross-layer attention residuals; src/llama-hparams.h)
    attn_res_block_size: int = 0


def hparams_from_shape(
    shape: K3Shape, *, block_count: int | None = None, head_count_kv: tuple[int, ...] | None = None
) -> K3HParams:
    """The hyper-parameters of a model of ``shape``: what a header says of it (the
    validator, with ``block_count`` and ``head_count_kv`` as the header gives them, the
    nextn blocks included) or what the planner assumes of a tier (the shape's own)."""
    return K3HParams(
        context_length=shape.context_length,
        embedding_length=shape.n_embd,
        block_count=shape.n_layer if block_count is None else block_count,
        head_count=shape.n_head,
        head_count_kv=tuple(shape.head_count_kv()) if head_count_kv is None else head_count_kv,
        kv_lora_rank=shape.kv_lora_rank,
        key_length_mla=shape.key_length_mla,
        value_length_mla=shape.value_length_mla,
        rope_dimension_count=shape.rope_dim,
        ssm_conv_kernel=shape.conv_kernel,
        kda_head_dim=shape.head_dim_kda,
        expert_count=shape.n_expert,
        expert_used_count=shape.n_expert_used,
        expert_feed_forward_length=shape.n_ff_expert,
        expert_shared_count=shape.n_expert_shared,
        expert_latent_length=shape.n_latent,
        leading_dense_block_count=shape.n_dense_lead,
        vocab_size=shape.n_vocab,
        attn_res_block_size=shape.attn_res_block_size,
    )


@dataclass(frozen=True)
class ModelLayout:
    architecture: str
    parts: tuple[Path, ...]  # in split order; parts[0] is what -m takes
    part_sizes: tuple[int, ...]  # file sizes in bytes
    hparams: K3HParams
    layers: tuple[LayerLayout, ...]
    # token_embd, output, output_norm, output_res_score, ...: not in any blk.N
    global_bytes: int
    # token_embd alone (stays in RAM in llama.cpp: the input embedding is on the CPU)
    token_embd_bytes: int
    tensor_count: int
    type_counts: dict[str, int]  # ggml type name -> number of tensors
    name: str = ""  # general.name, if any
    # every tensor, when the reader (or an estimate) keeps them; planning uses the
    # per-type bytes for its speed model and falls back to per-layer totals when empty
    tensors: tuple[TensorEntry, ...] = ()

    @property
    def first_part(self) -> Path:
        return self.parts[0]

    @property
    def total_tensor_bytes(self) -> int:
        return self.global_bytes + sum(layer.total_bytes for layer in self.layers)

    @property
    def total_file_bytes(self) -> int:
        return sum(self.part_sizes)

    @property
    def expert_bytes(self) -> int:
        return sum(layer.expert_bytes for layer in self.layers)

    @property
    def moe_layers(self) -> tuple[LayerLayout, ...]:
        return tuple(layer for layer in self.layers if layer.ffn == "moe")
