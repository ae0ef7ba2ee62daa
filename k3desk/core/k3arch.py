"""The Kimi-K3 (``kimi-k3``) tensor layout as llama.cpp b11434 loads it.

One description serves four purposes: the tiny random-weight test models, the
sparse "twins" of published tiers, layout estimates for tiers not yet
downloaded, and the validator's rules.  :func:`loader_tensors` follows
``llama_model_kimi_k3::load_arch_tensors`` in ``src/models/kimi-k3.cpp`` of
b11434 line by line: the tensors it creates, in its order, with the
``create_tensor`` flag each carries (0 = required, ``TENSOR_NOT_REQUIRED`` =
optional) and the alternatives it accepts.  :func:`tensor_specs` is the same
walk with the choices a converter makes, so what the writers write is what
the loader asks for, by construction.

Shapes are in ggml order (ne0 first), as GGUF stores them, and as ggml's
writer stores them: ``ggml_n_dims`` dimensions, trailing 1s dropped (the
convolutions are ``[d_conv, 1, d_inner]``).  The loader compares shapes
padded to 4 dimensions with 1s (``llama_model_loader::check_tensor_dims``),
so ``[4, 1, 64]`` and ``[4, 1, 64, 1]`` are the same shape: use
:func:`same_shape`.

The real model's counts check out against GrEarl's card: 93 layers, 69 KDA +
24 MLA (every fourth layer and the last), 1 dense lead + 92 MoE layers, 2,573
tensors of which 1,112 F32 / 117 F16 (ssm_f_b, attn_k_b, attn_v_b) /
276 routed-expert / 1 output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
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
    "scale",  # the optional .scale / .input_scale of a weight (F32 or F16)
]

EXPERT_SUFFIXES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
GGML_MAX_DIMS = 4  # ggml.h


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
    n_latent: int = 3584  # 0 = no latent MoE: experts at n_embd, no ffn_routed_*
    # two shared experts of width 3072: makes the Q4_K share of GrEarl's tier
    # come out at its published 28.6 GiB (one would leave 6 G parameters missing)
    n_expert_shared: int = 2
    n_vocab: int = 163840
    attn_gate: bool = True  # the optional MLA output gate is written
    context_length: int = 1048576
    # every `mla_every`-th layer (1-based) and the last layer use MLA; the rest KDA
    mla_every: int = 4
    # the MLA layers as a file's head_count_kv gives them (None: the pattern above)
    mla_layers: frozenset[int] | None = None
    attn_res: bool = True  # attn_res.block_size > 0: the residual-attention scores
    # `attn_res.block_size`: every this-many layers (from layer 0) the AttnRes stack
    # banks a checkpoint (`il % res_bs == 0` in src/models/kimi-k3.cpp, b11434);
    # 12 in moonshotai/Kimi-K3's config.json (`attn_res_block_size`)
    attn_res_block_size: int = 12

    def is_mla(self, layer: int) -> bool:
        if self.mla_layers is not None:
            return layer in self.mla_layers
        return (layer + 1) % self.mla_every == 0 or layer == self.n_layer - 1

    def head_count_kv(self) -> list[int]:
        return [1 if self.is_mla(i) else 0 for i in range(self.n_layer)]

    @property
    def n_ff_shexp(self) -> int:
        """Width of the shared experts: llama.cpp derives it, there is no key for it
        (``n_ff_exp * (n_expert_shared > 0 ? n_expert_shared : 1)``, kimi-k3.cpp)."""
        return self.n_ff_expert * (self.n_expert_shared if self.n_expert_shared > 0 else 1)

    def with_experts(self, n_expert: int, n_ff_expert: int) -> K3Shape:
        """This shape with ``n_expert`` routed experts of width ``n_ff_expert`` (a pruned
        or narrowed tier), its shared experts unchanged.

        llama.cpp derives the shared experts' width from the routed width (see
        :attr:`n_ff_shexp`), as the HF modeling code does, so a checkpoint whose routed
        experts were narrowed but whose shared experts were kept can only say so by
        raising ``expert_shared_count``: 2 x 3072 stays 4 x 1536.
        """
        shared = self.n_ff_shexp
        count = shared // n_ff_expert if n_ff_expert and shared % n_ff_expert == 0 else 0
        return replace(
            self,
            n_expert=n_expert,
            n_ff_expert=n_ff_expert,
            n_expert_shared=count or self.n_expert_shared,
        )

    @property
    def n_embd_latent(self) -> int:
        """Width the routed experts work at (kimi-k3.cpp: n_embd without latent MoE)."""
        return self.n_latent if self.n_latent > 0 else self.n_embd


REAL_K3 = K3Shape()

# The reduced Kimi-K3 the speed checks measure (k3desk/devtools/benchk3.py): the real
# model's structure and proportions (attention of n_embd-wide heads, every fourth layer
# MLA, a latent MoE at half the width, two shared experts, q and kv compression), at
# 2,048 wide.  Widths are multiples of 256 so every k- and i-quant applies where it does
# on the real model.
REDUCED_K3 = K3Shape(
    n_embd=2048,
    n_layer=16,
    n_head=16,
    head_dim_kda=128,
    q_lora_rank=512,
    kv_lora_rank=256,
    rope_dim=64,
    key_length_mla=192,
    value_length_mla=128,
    n_ff_dense=5632,
    n_dense_lead=1,
    n_expert=128,
    n_expert_used=8,
    n_ff_expert=768,
    n_latent=1024,
    n_expert_shared=2,
    n_vocab=32768,
    context_length=65536,
    mla_every=4,
    # a checkpoint of the AttnRes stack every 2 layers: 8 over 16 layers, as the real
    # model banks 8 over its 93 at every 12 (src/models/kimi-k3.cpp, b11434)
    attn_res_block_size=2,
)

# The same, dense (no experts) and about 0.6 G weights: the single-type models the
# shipped kernel costs are measured on (bench/kernel_costs.py) and the CPU check times
# (k3desk/core/tuning/cpuprobe.py), far more weights than any cache holds.
KERNEL_K3 = replace(
    REDUCED_K3, n_layer=8, n_dense_lead=8, n_ff_dense=8192, n_expert=16, n_vocab=4096
)

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
    n_vocab=512,
    context_length=4096,
    mla_every=3,
    attn_res_block_size=2,
)

# The tiny model with rows of 256 values wherever K3 has a wide row, so that
# llama-quantize's k-quants and i-quants (blocks of 256) apply to it instead of
# falling back to Q5_0/Q8_0 as they do on TINY_K3's 64-wide rows.  The tests
# quantize it with the engine's own tools (about 15 MB at F16).
TINY_K3_WIDE = K3Shape(
    n_embd=256,
    n_layer=6,
    n_head=4,
    head_dim_kda=64,
    q_lora_rank=0,
    kv_lora_rank=64,
    rope_dim=8,
    key_length_mla=32,
    value_length_mla=16,
    n_ff_dense=256,
    n_dense_lead=1,
    n_expert=4,
    n_expert_used=2,
    n_ff_expert=256,
    n_latent=256,
    n_expert_shared=1,
    n_vocab=512,
    context_length=4096,
    mla_every=3,
    attn_res_block_size=2,
)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order, trailing 1s dropped
    role: Role
    layer: int | None  # None for global tensors
    # the create_tensor flag: False for TENSOR_NOT_REQUIRED (absent is fine, but a
    # present tensor must still have this shape: check_tensor_dims throws otherwise)
    required: bool = True


def padded(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` as ggml holds it: ``GGML_MAX_DIMS`` dimensions, missing ones 1."""
    return tuple(shape) + (1,) * (GGML_MAX_DIMS - len(shape))


def same_shape(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """True when ggml sees one shape (``check_tensor_dims``: trailing 1s do not count)."""
    return padded(a) == padded(b)


Has = Callable[[str], bool]


# The weights whose optional ".scale" and ".input_scale" tensors llama.cpp loads
# for every architecture (llama_model_base::load_tensors in llama-model.cpp, "generic
# pass: load optional per-tensor/per-expert .scale tensors (e.g. NVFP4 scale2)"):
# per-tensor ones of shape {1}, per-expert ones of shape {n_expert}.  A scale is
# created only when its weight was.
_SCALED = (
    "attn_q", "attn_k", "attn_v", "attn_output", "attn_qkv", "attn_gate",
    "ffn_gate", "ffn_down", "ffn_up", "ffn_gate_shexp", "ffn_down_shexp", "ffn_up_shexp",
    "ssm_in", "ssm_out", "ssm_alpha", "ssm_beta",
)  # fmt: skip
_SCALED_PER_EXPERT = EXPERT_SUFFIXES
SCALE_SUFFIXES = ("scale", "input_scale")


def loader_tensors(s: K3Shape, has: Has, output_nvfp4: bool = False) -> Iterator[TensorSpec]:
    """The tensors llama.cpp b11434 creates for a kimi-k3 model of shape ``s``.

    ``has(name)`` says whether the file holds a tensor; it decides the branches
    the loader takes (an optional tensor present, or one form instead of
    another).  Every tensor yielded is one the loader asks for: a required one
    (``spec.required``) must be in the file, an optional one is yielded only when
    present.  A file tensor never yielded is one the loader does not use, and
    ``llama_model_loader::done_getting_tensors`` refuses the file for it ("wrong
    number of tensors").  Widths that may be per-layer arrays in a file
    (feed_forward_length, expert_feed_forward_length) are layer 0's for every
    layer, as ``hparams.n_ff()`` and ``n_ff_exp()`` give them.
    """
    e = s.n_embd
    yield TensorSpec("token_embd.weight", (e, s.n_vocab), "token_embd", None)
    yield TensorSpec("output_norm.weight", (e,), "norm", None)
    yield TensorSpec("output.weight", (e, s.n_vocab), "output", None)
    if s.attn_res:  # if (hparams.attn_res_block_size > 0)
        yield TensorSpec("output_res_score.weight", (e,), "norm", None)
    for i in range(s.n_layer):
        created = list(_layer_tensors(s, i, has))
        yield from created
        yield from _scales(s, created, has)
    if output_nvfp4:  # "output scales": only for an NVFP4 output.weight
        for x in SCALE_SUFFIXES:
            if has("output." + x):
                yield TensorSpec("output." + x, (1,), "scale", None, required=False)


def _scales(s: K3Shape, created: list[TensorSpec], has: Has) -> Iterator[TensorSpec]:
    """The optional scale tensors of a layer's weights (see ``_SCALED``)."""
    for spec in created:
        stem, _, suffix = spec.name.rpartition(".")
        base = stem.split(".", 2)[-1]
        if suffix != "weight" or base not in _SCALED + _SCALED_PER_EXPERT:
            continue
        shape = (s.n_expert,) if base in _SCALED_PER_EXPERT else (1,)
        for x in SCALE_SUFFIXES:
            if has(f"{stem}.{x}"):
                yield TensorSpec(f"{stem}.{x}", shape, "scale", spec.layer, required=False)


class _LayerSpecs:
    """The tensor specs of layer ``i``: required ones, and optional ones the file has."""

    def __init__(self, i: int, has: Has) -> None:
        self.i, self.has, self.prefix = i, has, f"blk.{i}."

    def __contains__(self, name: str) -> bool:
        return self.has(self.prefix + name)

    def t(self, name: str, shape: tuple[int, ...], role: Role, required: bool = True) -> TensorSpec:
        return TensorSpec(self.prefix + name, shape, role, self.i, required)

    def opt(self, name: str, shape: tuple[int, ...], role: Role) -> Iterator[TensorSpec]:
        if name in self:
            yield self.t(name, shape, role, required=False)


def _layer_tensors(s: K3Shape, i: int, has: Has) -> Iterator[TensorSpec]:
    e = s.n_embd
    blk = _LayerSpecs(i, has)
    yield blk.t("attn_norm.weight", (e,), "norm")
    yield blk.t("ffn_norm.weight", (e,), "norm")
    if s.attn_res:
        yield blk.t("attn_res_score.weight", (e,), "norm")
        yield blk.t("ffn_res_score.weight", (e,), "norm")
    if not s.is_mla(i):  # hparams.is_recr(i): head_count_kv[i] == 0 marks a KDA layer
        yield from _kda_tensors(s, blk)
    else:
        yield from _mla_tensors(s, blk)
    yield from _ffn_tensors(s, blk)


def _kda_tensors(s: K3Shape, blk: _LayerSpecs) -> Iterator[TensorSpec]:
    e = s.n_embd
    d = s.n_head * s.head_dim_kda
    # conv1d "may be stored 4D [d_conv, 1, d_inner, 1] or 3D": one shape to ggml
    for x in ("q", "k", "v"):
        yield blk.t(f"ssm_conv1d_{x}.weight", (s.conv_kernel, 1, d), "conv")
    # create_tensor_qkv (llama-model.cpp): a fused attn_qkv may stand for q, k, v
    if "attn_qkv.weight" in blk:
        yield blk.t("attn_qkv.weight", (e, 3 * d), "attn", required=False)
        if "attn_qkv.bias" in blk:
            yield blk.t("attn_qkv.bias", (3 * d,), "norm", required=False)
        else:
            for x in ("q", "k", "v"):
                yield from blk.opt(f"attn_{x}.bias", (d,), "norm")
    else:
        for x in ("q", "k", "v"):
            yield blk.t(f"attn_{x}.weight", (e, d), "attn")
        for x in ("q", "k", "v"):
            yield from blk.opt(f"attn_{x}.bias", (d,), "norm")
    yield blk.t("ssm_f_a.weight", (e, s.head_dim_kda), "attn")
    yield blk.t("ssm_f_b.weight", (s.head_dim_kda, d), "odd_row")
    yield blk.t("ssm_beta.weight", (e, s.n_head), "attn")
    yield blk.t("ssm_a", (s.n_head,), "norm")  # LLM_TENSOR_SSM_A_NOSCAN: no ".weight"
    yield blk.t("ssm_dt.bias", (d,), "norm")
    yield blk.t("ssm_g.weight", (e, d), "attn")
    yield blk.t("ssm_norm.weight", (s.head_dim_kda,), "norm")
    yield blk.t("attn_output.weight", (d, e), "attn")


def _mla_tensors(s: K3Shape, blk: _LayerSpecs) -> Iterator[TensorSpec]:
    e, h = s.n_embd, s.n_head
    nope = s.key_length_mla - s.rope_dim  # qk_nope_head_dim = n_embd_head_k - n_rot
    yield from blk.opt("attn_q_a_norm.weight", (s.q_lora_rank,), "norm")
    yield blk.t("attn_kv_a_norm.weight", (s.kv_lora_rank,), "norm")
    if "attn_q_a_norm.weight" in blk:
        yield blk.t("attn_q_a.weight", (e, s.q_lora_rank), "attn")
        yield blk.t("attn_q_b.weight", (s.q_lora_rank, h * s.key_length_mla), "attn")
    else:
        yield blk.t("attn_q.weight", (e, h * s.key_length_mla), "attn")
    yield blk.t("attn_kv_a_mqa.weight", (e, s.kv_lora_rank + s.rope_dim), "attn")
    # TENSOR_NOT_REQUIRED | TENSOR_SKIP_IF_VIRTUAL; without it, k_b and v_b
    kv_b = (s.kv_lora_rank, h * (nope + s.value_length_mla))
    if "attn_kv_b.weight" in blk:
        yield blk.t("attn_kv_b.weight", kv_b, "attn", required=False)
    else:
        yield blk.t("attn_k_b.weight", (nope, s.kv_lora_rank, h), "odd_row")
        yield blk.t("attn_v_b.weight", (s.kv_lora_rank, s.value_length_mla, h), "odd_row")
    yield from blk.opt("attn_gate.weight", (e, h * s.value_length_mla), "attn")
    yield blk.t("attn_output.weight", (h * s.value_length_mla, e), "attn")


def _ffn_tensors(s: K3Shape, blk: _LayerSpecs) -> Iterator[TensorSpec]:
    e, n_ff = s.n_embd, s.n_ff_dense
    if blk.i < s.n_dense_lead:
        yield blk.t("ffn_gate.weight", (e, n_ff), "dense_ffn")
        yield blk.t("ffn_down.weight", (n_ff, e), "dense_ffn")
        yield blk.t("ffn_up.weight", (e, n_ff), "dense_ffn")
        return
    n, lat, ff = s.n_expert, s.n_embd_latent, s.n_ff_expert
    yield blk.t("ffn_gate_inp.weight", (e, n), "router")
    yield blk.t("exp_probs_b.bias", (n,), "norm")
    yield blk.t("ffn_gate_exps.weight", (lat, ff, n), "experts")
    yield blk.t("ffn_down_exps.weight", (ff, lat, n), "experts")
    yield blk.t("ffn_up_exps.weight", (lat, ff, n), "experts")
    if s.n_latent > 0:  # if (hparams.n_expert_latent > 0)
        yield blk.t("ffn_routed_down.weight", (e, lat), "latent")
        yield blk.t("ffn_routed_up.weight", (lat, e), "latent")
        yield from blk.opt("ffn_routed_norm.weight", (lat,), "norm")
    sh = s.n_ff_shexp
    yield from blk.opt("ffn_gate_shexp.weight", (e, sh), "shexp")
    yield from blk.opt("ffn_down_shexp.weight", (sh, e), "shexp")
    yield from blk.opt("ffn_up_shexp.weight", (e, sh), "shexp")


def _written(s: K3Shape) -> Has:
    """The optional tensors a converter writes for ``s`` (conversion/kimi_k3.py)."""

    def has(name: str) -> bool:
        suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
        if suffix == "attn_q_a_norm.weight":
            return s.q_lora_rank > 0
        if suffix == "attn_gate.weight":
            return s.attn_gate
        if suffix == "ffn_routed_norm.weight":
            return True
        if suffix.endswith("_shexp.weight"):
            return s.n_expert_shared > 0
        return False  # attn_kv_b, a fused attn_qkv and q/k/v biases are not written

    return has


# The order converters write a layer's tensors in (and the tiny models, whose random
# weights are drawn in this order: a different order would be a different model).
_WRITE_SUFFIXES = (
    "attn_norm.weight", "ffn_norm.weight", "attn_res_score.weight", "ffn_res_score.weight",
    "ssm_conv1d_q.weight", "ssm_conv1d_k.weight", "ssm_conv1d_v.weight",
    "attn_kv_a_norm.weight", "attn_q_a_norm.weight", "attn_q_a.weight", "attn_q_b.weight",
    "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_kv_a_mqa.weight",
    "attn_k_b.weight", "attn_v_b.weight", "attn_gate.weight",
    "ssm_f_a.weight", "ssm_f_b.weight", "ssm_beta.weight", "ssm_a", "ssm_dt.bias",
    "ssm_g.weight", "ssm_norm.weight", "attn_output.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
    "ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_gate_exps.weight", "ffn_up_exps.weight",
    "ffn_down_exps.weight", "ffn_routed_down.weight", "ffn_routed_up.weight",
    "ffn_routed_norm.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
    "ffn_down_shexp.weight",
)  # fmt: skip
_WRITE_ORDER = {suffix: i for i, suffix in enumerate(_WRITE_SUFFIXES)}
_FIRST, _LAST = ("token_embd.weight",), ("output_norm.weight", "output.weight")


def _write_key(spec: TensorSpec) -> tuple[int, int]:
    if spec.layer is not None:
        return (spec.layer + 1, _WRITE_ORDER[spec.name.split(".", 2)[2]])
    if spec.name in _FIRST:
        return (0, 0)
    return (1 << 30, _LAST.index(spec.name) if spec.name in _LAST else len(_LAST))


def tensor_specs(s: K3Shape) -> Iterator[TensorSpec]:
    """Every tensor of a kimi-k3 model with shape ``s`` as a converter writes it: what
    :func:`loader_tensors` asks for, with the converter's optional tensors, in the
    converter's order (token_embd, the layers, then the output tensors)."""
    return iter(sorted(loader_tensors(s, _written(s)), key=_write_key))


def quantize_order(names: list[str]) -> list[str]:
    """``names`` in the order llama-quantize and llama-gguf-split write tensors.

    llama-quantize walks ``llama_model_loader::weights_map``, a map ordered by
    ``weight_name_comparer`` (llama-model-loader.h): by layer number (tensors
    outside any ``blk.N`` count as layer -1), then by name.
    """

    def key(name: str) -> tuple[int, str]:
        layer = layer_of(name)
        return (-1 if layer is None else layer, name)

    return sorted(names, key=key)


def is_expert_tensor(name: str) -> bool:
    """True for the routed-expert tensors ``--n-cpu-moe`` keeps in RAM."""
    return name.endswith(("_exps.weight", "_chexps.weight"))


def layer_of(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    end = name.find(".", 4)
    digits = name[4:end] if end > 0 else ""
    return int(digits) if digits.isdigit() else None
