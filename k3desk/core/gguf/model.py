"""What k3desk knows about a Kimi-K3 GGUF shard set after reading its headers.

Produced by :func:`k3desk.core.gguf.validate.validate_shard_set` (header-only
reads) and consumed by planning.  Sizes are bytes of tensor data as stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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
