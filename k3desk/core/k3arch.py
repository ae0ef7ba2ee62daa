"""The Kimi-K3 (``kimi-k3``) tensor layout as llama.cpp b11434 loads it.

One description serves three purposes: the tiny random-weight test models,
the sparse "twins" of published tiers, and layout estimates for tiers not yet
downloaded.  Shapes are in ggml order (ne0 first), as GGUF stores them.

The real model's counts check out against GrEarl's card: 93 layers, 69 KDA +
24 MLA (every fourth layer and the last), 1 dense lead + 92 MoE layers, 2,573
tensors of which 1,112 F32 / 117 F16 (ssm_f_b, attn_k_b, attn_v_b) /
276 routed-expert / 1 output.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

# What a tensor is, for choosing its quantization type and its placement.
Role = Literal[
    "token_embd",
    "output",
    "norm",  # 1-D F32 (norms, res scores, biases, ssm_a, ssm_dt)
    "router",  # ffn_gate_inp (kept F32)
    "conv",  # ssm_conv1d_* (kept F32)
    "odd_row",  # row length not a multiple of 256: ssm_f_b, attn_k_b, attn_v_b (F16)
    "attn",  # 2-D attention / KDA weights
    "dense_ffn",  # blk.0 dense MLP
    "shexp",  # shared expert
    "latent",  # ffn_routed_{up,down} (latent MoE projections)
    "experts",  # ffn_{gate,up,down}_exps: the routed experts
]

EXPERT_SUFFIXES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class K3Shape:
    """Hyper-parameters that determine every tensor shape."""

    n_embd: int = 7168
    n_layer: int = 93
    n_head: int = 96
    head_dim_kda: int = 128
    conv_kernel: int = 4
    q_lora_rank: int = 1536  # 0 = no q compression (attn_q instead of attn_q_a/b)
    kv_lora_rank: int = 512
    rope_dim: int = 64
    key_length_mla: int = 192  # nope + rope
    value_length_mla: int = 128
    n_ff_dense: int = 18432
    n_dense_lead: int = 1
    n_expert: int = 896
    n_expert_used: int = 16
    n_ff_expert: int = 3072
    n_latent: int = 3584
    # two shared experts of width 3072: makes the Q4_K share of GrEarl's tier
    # come out at its published 28.6 GiB (one would leave 6 G parameters missing)
    n_expert_shared: int = 2
    n_ff_shexp: int = 3072
    n_vocab: int = 163840
    attn_gate: bool = True
    context_length: int = 1048576
    # every `mla_every`-th layer (1-based) and the last layer use MLA; the rest KDA
    mla_every: int = 4
    # `attn_res.block_size`: every this-many layers (from layer 0) the AttnRes stack
    # banks a checkpoint (`il % res_bs == 0` in src/models/kimi-k3.cpp, b11434);
    # 12 in moonshotai/Kimi-K3's config.json (`attn_res_block_size`)
    attn_res_block_size: int = 12

    def is_mla(self, layer: int) -> bool:
        return (layer + 1) % self.mla_every == 0 or layer == self.n_layer - 1

    def head_count_kv(self) -> list[int]:
        return [1 if self.is_mla(i) else 0 for i in range(self.n_layer)]


REAL_K3 = K3Shape()

# The tiny model the tests serve with the real llama-server (tiny-k3-gguf.md).
TINY_K3 = K3Shape(
    n_embd=64,
    n_layer=6,
    n_head=4,
    head_dim_kda=16,
    q_lora_rank=0,
    kv_lora_rank=32,
    rope_dim=8,
    key_length_mla=24,
    value_length_mla=16,
    n_ff_dense=128,
    n_dense_lead=1,
    n_expert=8,
    n_expert_used=2,
    n_ff_expert=32,
    n_latent=32,
    n_expert_shared=1,
    n_ff_shexp=32,
    n_vocab=512,
    context_length=4096,
    mla_every=3,
    attn_res_block_size=2,
)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    role: Role
    layer: int | None  # None for global tensors


def tensor_specs(s: K3Shape) -> Iterator[TensorSpec]:
    """Every tensor of a kimi-k3 model with shape ``s``, in file order."""
    e = s.n_embd
    yield TensorSpec("token_embd.weight", (e, s.n_vocab), "token_embd", None)
    for i in range(s.n_layer):
        yield from _layer_specs(s, i)
    yield TensorSpec("output_norm.weight", (e,), "norm", None)
    yield TensorSpec("output.weight", (e, s.n_vocab), "output", None)
    yield TensorSpec("output_res_score.weight", (e,), "norm", None)


def _layer_specs(s: K3Shape, i: int) -> Iterator[TensorSpec]:
    e = s.n_embd
    p = f"blk.{i}."

    def t(name: str, shape: tuple[int, ...], role: Role) -> TensorSpec:
        return TensorSpec(p + name, shape, role, i)

    yield t("attn_norm.weight", (e,), "norm")
    yield t("ffn_norm.weight", (e,), "norm")
    yield t("attn_res_score.weight", (e,), "norm")
    yield t("ffn_res_score.weight", (e,), "norm")
    if s.is_mla(i):
        h = s.n_head
        nope = s.key_length_mla - s.rope_dim
        yield t("attn_kv_a_norm.weight", (s.kv_lora_rank,), "norm")
        if s.q_lora_rank:
            yield t("attn_q_a_norm.weight", (s.q_lora_rank,), "norm")
            yield t("attn_q_a.weight", (e, s.q_lora_rank), "attn")
            yield t("attn_q_b.weight", (s.q_lora_rank, h * s.key_length_mla), "attn")
        else:
            yield t("attn_q.weight", (e, h * s.key_length_mla), "attn")
        yield t("attn_kv_a_mqa.weight", (e, s.kv_lora_rank + s.rope_dim), "attn")
        yield t("attn_k_b.weight", (nope, s.kv_lora_rank, h), "odd_row")
        yield t("attn_v_b.weight", (s.kv_lora_rank, s.value_length_mla, h), "odd_row")
        if s.attn_gate:
            yield t("attn_gate.weight", (e, h * s.value_length_mla), "attn")
        yield t("attn_output.weight", (h * s.value_length_mla, e), "attn")
    else:
        d = s.n_head * s.head_dim_kda
        for x in ("q", "k", "v"):
            yield t(f"ssm_conv1d_{x}.weight", (s.conv_kernel, 1, d, 1), "conv")
        for x in ("q", "k", "v"):
            yield t(f"attn_{x}.weight", (e, d), "attn")
        yield t("ssm_f_a.weight", (e, s.head_dim_kda), "attn")
        yield t("ssm_f_b.weight", (s.head_dim_kda, d), "odd_row")
        yield t("ssm_beta.weight", (e, s.n_head), "attn")
        yield t("ssm_a", (s.n_head,), "norm")
        yield t("ssm_dt.bias", (d,), "norm")
        yield t("ssm_g.weight", (e, d), "attn")
        yield t("ssm_norm.weight", (s.head_dim_kda,), "norm")
        yield t("attn_output.weight", (d, e), "attn")
    if i < s.n_dense_lead:
        yield t("ffn_gate.weight", (e, s.n_ff_dense), "dense_ffn")
        yield t("ffn_up.weight", (e, s.n_ff_dense), "dense_ffn")
        yield t("ffn_down.weight", (s.n_ff_dense, e), "dense_ffn")
    else:
        n, lat, ff = s.n_expert, s.n_latent, s.n_ff_expert
        yield t("ffn_gate_inp.weight", (e, n), "router")
        yield t("exp_probs_b.bias", (n,), "norm")
        yield t("ffn_gate_exps.weight", (lat, ff, n), "experts")
        yield t("ffn_up_exps.weight", (lat, ff, n), "experts")
        yield t("ffn_down_exps.weight", (ff, lat, n), "experts")
        yield t("ffn_routed_down.weight", (e, lat), "latent")
        yield t("ffn_routed_up.weight", (lat, e), "latent")
        yield t("ffn_routed_norm.weight", (lat,), "norm")
        sh = s.n_ff_shexp * s.n_expert_shared
        yield t("ffn_gate_shexp.weight", (e, sh), "shexp")
        yield t("ffn_up_shexp.weight", (e, sh), "shexp")
        yield t("ffn_down_shexp.weight", (sh, e), "shexp")


def is_expert_tensor(name: str) -> bool:
    """True for the routed-expert tensors ``--n-cpu-moe`` keeps in RAM."""
    return any(name.endswith(sfx + ".weight") for sfx in EXPERT_SUFFIXES) or any(
        name.endswith(sfx) for sfx in ("_exps.weight", "_chexps.weight")
    )


def layer_of(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    try:
        return int(name.split(".", 2)[1])
    except (IndexError, ValueError):
        return None
