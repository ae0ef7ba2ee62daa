"""Memory that is not weights: KV cache, KDA recurrent state, compute buffers, projector.

Kimi-K3 mixes two kinds of attention layer (``head_count_kv`` says which):

* **MLA** layers (every fourth and the last; 24 of 93) keep a KV cache.  llama.cpp
  stores MLA's *compressed latent*, not per-head keys and values: per token and
  layer one row of ``kv_lora_rank + rope_dim`` elements (512 + 64 = 576) in the
  K cache, at the ``-ctk`` type's size; the V cache is a view of the same latent,
  so it adds nothing.  That is 27 KiB per token for the whole model at f16:
  8,192 tokens cost 216 MiB, the full 1,048,576 tokens 27 GiB.  (The
  ``2 * layers * kv_heads * head_dim`` formulas other apps use would be wrong
  by two orders of magnitude here.)
* **KDA** (linear attention) layers keep a fixed-size recurrent state per
  sequence, independent of the context: ``n_head * head_dim^2`` f32 for the
  state matrix plus ``(conv_kernel - 1) * 3 * n_head * head_dim`` f32 for the
  short convolutions of q, k and v: 6.7 MB per layer, 464 MB for 69 layers.

Compute buffers are what llama.cpp's scheduler reserves for the largest graph
(a full ubatch of prompt tokens).  We estimate the live f32 tensors of that
graph; the terms are listed in :func:`compute_buffer_bytes`.  The result
(0.54 GiB per GPU at ubatch 512 and 8 K context, 0.86 GiB on the one holding
the output layer, plus 384 MiB of CUDA runtime) is of the order llama.cpp
prints for DeepSeek-class models.

On top of that comes K3's **AttnRes checkpoint stack** (``src/models/kimi-k3.cpp``,
b11434): every ``attn_res.block_size`` layers from layer 0, ``res_push`` concatenates
the layer's input onto a ``[n_embd, n_ckpt, n_tokens]`` f32 stack, and every
``res_mix`` RMS-normalises a copy of the whole stack to score it.  It grows with the
layer index, so the device holding the last layers needs the most:
:func:`attn_res_stack_bytes`.  With K3's block size of 12 that is 8 checkpoints at
the end, 0.33 GiB at ubatch 512; a file with block size 1 would need 3.8 GiB there.
"""

from __future__ import annotations

import os
from pathlib import Path

from k3desk.core.errors import PlanError
from k3desk.core.gguf.model import K3HParams
from k3desk.core.units import MiB

# Bytes per element of the cache types llama.cpp accepts for -ctk/-ctv.
KV_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "iq4_nl": 18 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
}

# The CUDA context, cuBLAS workspace and ggml's per-device pools: memory a GPU
# loses as soon as llama-server uses it, before any buffer is allocated.
CUDA_RUNTIME_BYTES = 384 * MiB

# A projector's own compute buffer while it encodes an image (MoonViT at the
# default image budget), on top of its weights.
MMPROJ_COMPUTE_BYTES = 512 * MiB

# What to budget for a projector whose size we do not know: MoonViT-3D (27
# blocks + mm_projector) is about 0.83 GiB in F16 (GrEarl's card).
MMPROJ_DEFAULT_BYTES = 900 * MiB


def kv_type_bytes(kv_type: str) -> float:
    try:
        return KV_TYPE_BYTES[kv_type.lower()]
    except KeyError:
        raise PlanError(
            f"Unknown KV cache type {kv_type!r}.",
            f"Use one of: {', '.join(KV_TYPE_BYTES)}.",
        ) from None


def is_mla_layer(hp: K3HParams, layer: int) -> bool:
    return layer < len(hp.head_count_kv) and hp.head_count_kv[layer] > 0


def kv_bytes_per_token(hp: K3HParams, kv_type: str = "f16") -> int:
    """KV bytes one token adds to the whole model (MLA layers only)."""
    row = hp.kv_lora_rank + hp.rope_dimension_count
    n_mla = sum(1 for i in range(hp.block_count) if is_mla_layer(hp, i))
    return round(row * kv_type_bytes(kv_type) * n_mla)


def kv_cache_layer_bytes(hp: K3HParams, layer: int, ctx: int, kv_type: str = "f16") -> int:
    """KV cache of one layer for ``ctx`` tokens (0 for KDA layers).

    ``ctx`` is llama-server's total ``-c``: with ``--parallel N`` the sequences
    share it, so the cache does not grow with N.
    """
    if ctx < 0:
        raise PlanError(f"The context length must not be negative (got {ctx}).")
    if not is_mla_layer(hp, layer):
        return 0
    row = hp.kv_lora_rank + hp.rope_dimension_count
    return round(row * kv_type_bytes(kv_type) * ctx)


def slot_context(ctx: int, parallel: int) -> tuple[int, int]:
    """(the engine's total context, each slot's) for ``-c ctx --parallel parallel``.

    llama.cpp b11434 (``src/llama-context.cpp``, KV not unified, as with an explicit
    ``--parallel``): the total is padded to 256, each sequence gets total / N padded to 256,
    and the total becomes N times that.  One slot keeps ``ctx`` as the plans always had it.
    """
    if parallel <= 1:
        return ctx, ctx
    pad = 256
    total = -(-ctx // pad) * pad
    per = -(-(total // parallel) // pad) * pad
    return per * parallel, per


def kv_cache_bytes(hp: K3HParams, ctx: int, kv_type: str = "f16") -> int:
    return sum(kv_cache_layer_bytes(hp, i, ctx, kv_type) for i in range(hp.block_count))


def recurrent_state_layer_bytes(hp: K3HParams, layer: int, parallel: int = 1) -> int:
    """KDA state of one layer for ``parallel`` sequences (0 for MLA layers)."""
    if is_mla_layer(hp, layer):
        return 0
    d = hp.kda_head_dim
    state = hp.head_count * d * d * 4
    conv = max(hp.ssm_conv_kernel - 1, 0) * 3 * hp.head_count * d * 4
    return (state + conv) * max(parallel, 1)


def recurrent_state_bytes(hp: K3HParams, parallel: int = 1) -> int:
    return sum(recurrent_state_layer_bytes(hp, i, parallel) for i in range(hp.block_count))


def graph_tokens(ubatch: int, ctx: int) -> int:
    """Tokens in the graph llama.cpp reserves buffers for: ``min(n_ctx, n_ubatch)``
    (``graph_reserve`` in src/llama-context.cpp, b11434)."""
    return max(1, min(ubatch, ctx) if ctx > 0 else ubatch)


def attn_res_checkpoints(hp: K3HParams, layer: int) -> int:
    """Checkpoints on the AttnRes stack once ``layer`` has run: layers 0, bs, 2 bs, ...
    up to ``layer`` bank one each (``il % res_bs == 0`` in src/models/kimi-k3.cpp)."""
    bs = hp.attn_res_block_size
    if bs <= 0 or layer < 0:
        return 0
    return min(layer, hp.block_count - 1) // bs + 1


def attn_res_stack_bytes(hp: K3HParams, last_layer: int, *, ubatch: int, ctx: int) -> int:
    """Peak bytes of the AttnRes stack on a device whose last layer is ``last_layer``.

    Three stacks are alive at once: the one ``res_push`` concatenates onto (``n - 1``
    checkpoints), the new one (``n``) and ``res_mix``'s normalised copy of it (``n``),
    each ``[n_embd, n_ckpt, n_tokens]`` f32.  Measured with the real llama-server (b11434)
    on tiny models: the compute buffer grows by 2.8-3.0 checkpoints' worth per banked
    checkpoint (tests/core/planning/test_attn_res_buffer.py).
    """
    n = attn_res_checkpoints(hp, last_layer)
    return 3 * n * hp.embedding_length * graph_tokens(ubatch, ctx) * 4


def compute_buffer_bytes(
    hp: K3HParams,
    ctx: int,
    *,
    ubatch: int = 512,
    flash_attn: bool = True,
    with_output: bool = False,
    experts_here: bool = True,
    last_layer: int | None = None,
) -> int:
    """The scheduler's compute buffer on one device (f32 activations of one ubatch).

    Terms, each ``4 bytes x ubatch x``:

    * ``8 n_embd``: residual stream, norms, attention input and output, AttnRes scores;
    * ``n_head x (key_length_mla + value_length_mla)``: MLA queries and outputs;
    * ``3 n_head x kda_head_dim``: KDA q, k, v (chunked: one chunk's state is small);
    * ``n_expert_used x (2 n_ff_expert + n_latent)``: the routed experts' gate/up
      outputs and their latent inputs (only where experts are computed);
    * ``n_vocab``: the logits (only on the device that holds ``output.weight``);

    plus the attention scores: with flash attention only the f16 mask
    (``2 x ubatch x ctx``); without it the full ``4 x ubatch x ctx x n_head``;
    and, when the device runs layers up to ``last_layer``, the AttnRes stack
    (:func:`attn_res_stack_bytes`).
    """
    stack = (
        0 if last_layer is None else attn_res_stack_bytes(hp, last_layer, ubatch=ubatch, ctx=ctx)
    )
    u = max(ubatch, 1)
    per_token = (
        8 * hp.embedding_length
        + hp.head_count * (hp.key_length_mla + hp.value_length_mla)
        + 3 * hp.head_count * hp.kda_head_dim
    )
    if experts_here:
        per_token += hp.expert_used_count * (
            2 * hp.expert_feed_forward_length + hp.expert_latent_length
        )
    if with_output:
        per_token += hp.vocab_size
    scores = 2 * u * ctx if flash_attn else 4 * u * ctx * hp.head_count
    return 4 * u * per_token + scores + stack


def mmproj_file_bytes(path: str | os.PathLike[str]) -> int:
    """Size of a projector file, or a PlanError that names it."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise PlanError(
            f"The projector file {p} does not exist.",
            "Pass the path of the downloaded mmproj-*.gguf, or leave out --mmproj.",
        ) from None
    except OSError as exc:
        raise PlanError(f"Cannot read the projector file {p}: {exc.strerror}.") from exc
    if not p.is_file():
        raise PlanError(f"The projector path {p} is not a file.")
    return size
