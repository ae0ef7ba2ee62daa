"""Small random-weight ``kimi-k3`` GGUF files and LLaVA-style projectors.

The engine probe loads one of these "canaries" to find out whether an engine
can load Kimi-K3 at all (a version string cannot tell), and the tiny test
models are written with the same code.  Everything is deterministic for a
given seed: the same arguments give byte-identical files.

Keys are written by their literal ``kimi-k3.*`` names because the ``gguf``
package on PyPI has no ``MODEL_ARCH.KIMI_K3`` constants.  Tensors follow
``k3arch.tensor_specs``, with the shapes ggml's own writer stores (trailing 1s
dropped): ``llama-quantize ... COPY`` rewrites these files unchanged (a test in
tests/oracle checks it).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from k3desk.core.k3arch import TINY_K3, K3Shape, TensorSpec, tensor_specs

ARCH = "kimi-k3"

# Control tokens of the Kimi-K3 tokenizer the chat template relies on.
CONTROL_TOKENS = (
    "[BOS]",
    "[EOS]",
    "[UNK]",
    "[PAD]",
    "<|open|>",
    "<|close|>",
    "<|sep|>",
    "<|end_of_msg|>",
    "<|kimi_image_placeholder|>",
)
BOS_TOKEN = "[BOS]"
EOS_TOKEN = "<|end_of_msg|>"

# Text the tiny byte-level BPE vocabulary learns its merges from.
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello, world! How are you today? "
    "I am a small language model with random weights, so what I say means nothing. "
    "Kimi is a large mixture of experts model; this file only has the same shape. "
    "The engine loads the model, reads the tokens, and answers the question. "
    "Please describe the image in one sentence. What is the capital of France? "
    "Paris is the capital of France, and Berlin is the capital of Germany. "
    "There are many experts in every layer, and the router picks two of them. "
    "Attention is what lets the model look back at the earlier tokens in the text. "
    "She said that they would come here after their meeting with the other people. "
    "We think this should work because there is nothing else that could go wrong. "
    "Numbers like 1, 2, 3, 42, 100 and 2026 appear in text as well as words do. "
    "import numpy as np; def main(): return print('hello') if True else None "
    "user assistant system message response think tools call argument json "
    "thinking_effort low high max image placeholder open close sep end of msg "
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _train_merges(corpus: str, n_merges: int) -> list[tuple[str, str]]:
    """A plain BPE trainer: deterministic (ties broken by the pair itself)."""
    b2u = bytes_to_unicode()
    words: Counter[tuple[str, ...]] = Counter()
    for m in re.finditer(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", corpus):
        words[tuple(b2u[b] for b in m.group().encode("utf-8"))] += 1
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in itertools.pairwise(word):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def build_vocab(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges of a byte-level BPE vocabulary of ``n_vocab``.

    Ids 0-255 are the bytes, then learnt merges, then the control tokens last
    (as in the real Kimi vocabulary); any gap is filled with unused tokens.
    """
    n_fixed = 256 + len(CONTROL_TOKENS)
    if n_vocab < n_fixed:
        raise ValueError(f"n_vocab must be at least {n_fixed}, got {n_vocab}")
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    seen = set(tokens)
    merges: list[str] = []
    for a, b in _train_merges(_CORPUS, n_vocab - n_fixed):
        merges.append(f"{a} {b}")
        if a + b not in seen and len(tokens) < n_vocab - len(CONTROL_TOKENS):
            tokens.append(a + b)
            seen.add(a + b)
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    i = 0
    while len(tokens) < n_vocab - len(CONTROL_TOKENS):
        tokens.append(f"<|reserved_{i}|>")
        types.append(int(gguf.TokenType.UNUSED))
        i += 1
    tokens.extend(CONTROL_TOKENS)
    types.extend([int(gguf.TokenType.CONTROL)] * len(CONTROL_TOKENS))
    return tokens, types, merges


def tensor_dtype(spec: TensorSpec) -> type[np.floating[Any]]:
    """F32 for 1-D tensors, norms, the router, convolutions and attn_k_b; F16 otherwise.

    attn_k_b stays F32: an F16 attn_k_b trips ``GGML_ASSERT(*cur_backend_id != -1)``
    on CPUs with AMX when weight repacking is on.
    """
    if len(spec.shape) == 1 or spec.role in ("norm", "router", "conv"):
        return np.float32
    if spec.name.endswith("attn_k_b.weight"):
        return np.float32
    return np.float16


def _tensor_data(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    shape = tuple(reversed(spec.shape))  # numpy order is ggml order reversed
    name = spec.name
    if "norm" in name:
        data = np.ones(shape, dtype=np.float32)
    elif name.endswith(".ssm_a"):
        data = -rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
    elif name.endswith("exp_probs_b.bias"):
        data = np.zeros(shape, dtype=np.float32)
    else:
        scale = 0.02 if len(spec.shape) == 1 else 1.0 / math.sqrt(spec.shape[0])
        data = rng.normal(0.0, scale, size=shape).astype(np.float32)
    return data.astype(tensor_dtype(spec))


def _balanced(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def shard_names(name: str, shards: int) -> list[str]:
    if shards == 1:
        return [f"{name}.gguf"]
    return [f"{name}-{i:05d}-of-{shards:05d}.gguf" for i in range(1, shards + 1)]


def write_k3_gguf(
    directory: Path,
    name: str,
    *,
    shape: K3Shape = TINY_K3,
    shards: int = 1,
    chat_template: str | None = None,
    seed: int = 0,
    architecture: str = ARCH,
) -> tuple[Path, ...]:
    """Write a random-weight kimi-k3 model into ``directory``; return its parts in order.

    With ``shards > 1`` the parts are named ``<name>-0000N-of-0000M.gguf`` and
    carry the ``split.*`` keys llama.cpp's split loader reads.  ``architecture``
    exists so tests can write a file the engine must refuse.
    """
    specs = list(tensor_specs(shape))
    if not 1 <= shards <= len(specs):
        raise ValueError(f"shards must be between 1 and {len(specs)}, got {shards}")
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    stem = directory / f"{name}.gguf"
    writer = gguf.GGUFWriter(stem, architecture, split_max_tensors=0)
    _add_k3_keys(writer, shape, name, chat_template, architecture)
    sizes = _balanced(len(specs), shards)
    for spec in specs:
        if shards > 1:
            # split exactly at the balanced boundaries: the writer starts a new part
            # once the current one holds split_max_tensors tensors
            writer.split_max_tensors = sizes[len(writer.tensors) - 1]
        data = _tensor_data(spec, rng)
        writer.add_tensor(spec.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    paths = tuple(directory / n for n in shard_names(name, shards))
    missing = [p for p in paths if not p.is_file()]
    if missing:  # the gguf package names parts itself; make sure we agree
        raise RuntimeError(f"expected GGUF parts were not written: {missing}")
    return paths


def write_k3_gguf_streamed(
    path: Path,
    name: str,
    *,
    shape: K3Shape,
    chat_template: str | None = None,
    seed: int = 0,
) -> Path:
    """Write one random-weight kimi-k3 file of any size, a tensor at a time.

    The same keys, tensors and random draws as :func:`write_k3_gguf` (one part), but
    each tensor is generated just before it is written, so a model of several GB
    needs no more memory than its largest tensor.
    """
    specs = list(tensor_specs(shape))
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, ARCH, split_max_tensors=0)
    _add_k3_keys(writer, shape, name, chat_template, ARCH)
    for spec in specs:
        dtype = np.dtype(tensor_dtype(spec))
        n = math.prod(spec.shape)
        writer.add_tensor_info(spec.name, tuple(reversed(spec.shape)), dtype, n * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for spec in specs:
        writer.write_tensor_data(_tensor_data(spec, rng))
    writer.close()
    return path


def _add_k3_keys(w: Any, s: K3Shape, name: str, chat_template: str | None, arch: str) -> None:
    k = f"{arch}."
    w.add_name(name)
    w.add_uint32(k + "context_length", s.context_length)
    w.add_uint32(k + "embedding_length", s.n_embd)
    w.add_uint32(k + "block_count", s.n_layer)
    w.add_uint32(k + "feed_forward_length", s.n_ff_dense)
    w.add_uint32(k + "attention.head_count", s.n_head)
    w.add_array(k + "attention.head_count_kv", s.head_count_kv())
    w.add_float32(k + "attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(k + "attention.kv_lora_rank", s.kv_lora_rank)
    if s.q_lora_rank:
        w.add_uint32(k + "attention.q_lora_rank", s.q_lora_rank)
    w.add_uint32(k + "rope.dimension_count", s.rope_dim)
    w.add_uint32(k + "attention.key_length", s.kv_lora_rank + s.rope_dim)
    w.add_uint32(k + "attention.value_length", s.kv_lora_rank)
    w.add_uint32(k + "attention.key_length_mla", s.key_length_mla)
    w.add_uint32(k + "attention.value_length_mla", s.value_length_mla)
    w.add_uint32(k + "ssm.conv_kernel", s.conv_kernel)
    w.add_uint32(k + "kda.head_dim", s.head_dim_kda)
    w.add_float32(k + "kda.gate_lower_bound", -5.0)
    w.add_uint32(k + "expert_count", s.n_expert)
    w.add_uint32(k + "expert_used_count", s.n_expert_used)
    w.add_uint32(k + "expert_feed_forward_length", s.n_ff_expert)
    w.add_uint32(k + "expert_shared_count", s.n_expert_shared)
    w.add_uint32(k + "leading_dense_block_count", s.n_dense_lead)
    w.add_float32(k + "expert_weights_scale", 1.0)
    w.add_bool(k + "expert_weights_norm", True)
    w.add_uint32(k + "expert_gating_func", 2)  # sigmoid
    w.add_uint32(k + "expert_latent_length", s.n_latent)
    w.add_float32(k + "activation.situ_beta", 8.0)
    w.add_float32(k + "activation.situ_linear_beta", 8.0)
    w.add_uint32(k + "attn_res.block_size", s.attn_res_block_size)
    w.add_uint32(k + "vocab_size", s.n_vocab)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))

    tokens, types, merges = build_vocab(s.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index(BOS_TOKEN))
    w.add_eos_token_id(tokens.index(EOS_TOKEN))
    w.add_unk_token_id(tokens.index("[UNK]"))
    w.add_pad_token_id(tokens.index("[PAD]"))
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)


# ------------------------------------------------------------------ projector
PROJ_IMAGE_SIZE = 32
PROJ_PATCH_SIZE = 8
PROJ_EMBD = 32
PROJ_FF = 64
PROJ_BLOCKS = 2
PROJ_HEADS = 2


def projector_tokens_per_image() -> int:
    """Image tokens the tiny projector adds to a prompt: (image/patch)^2."""
    return (PROJ_IMAGE_SIZE // PROJ_PATCH_SIZE) ** 2


def write_mlp_projector(
    path: Path, n_embd_text: int, *, seed: int = 1, projector_type: str = "mlp"
) -> Path:
    """Write a tiny LLaVA-1.5 style (``mlp``) vision projector for a text model of width
    ``n_embd_text``.  ``projector_type`` exists so tests can write one an engine refuses."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "clip")
    w.add_name(path.stem)
    w.add_string("clip.projector_type", projector_type)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", PROJ_IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", PROJ_PATCH_SIZE)
    w.add_uint32("clip.vision.embedding_length", PROJ_EMBD)
    w.add_uint32("clip.vision.feed_forward_length", PROJ_FF)
    w.add_uint32("clip.vision.projection_dim", n_embd_text)
    w.add_uint32("clip.vision.attention.head_count", PROJ_HEADS)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.block_count", PROJ_BLOCKS)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))

    e, ff = PROJ_EMBD, PROJ_FF
    n_pos = projector_tokens_per_image() + 1
    specs: list[tuple[str, Sequence[int]]] = [
        ("v.patch_embd.weight", (PROJ_PATCH_SIZE, PROJ_PATCH_SIZE, 3, e)),
        ("v.class_embd", (e,)),
        ("v.position_embd.weight", (e, n_pos)),
        ("v.pre_ln.weight", (e,)),
        ("v.pre_ln.bias", (e,)),
    ]
    for i in range(PROJ_BLOCKS):
        p = f"v.blk.{i}."
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            specs += [(p + t + ".weight", (e, e)), (p + t + ".bias", (e,))]
        for t in ("ln1", "ln2"):
            specs += [(p + t + ".weight", (e,)), (p + t + ".bias", (e,))]
        specs += [
            (p + "ffn_up.weight", (e, ff)),
            (p + "ffn_up.bias", (ff,)),
            (p + "ffn_down.weight", (ff, e)),
            (p + "ffn_down.bias", (e,)),
        ]
    specs += [
        ("mm.0.weight", (e, n_embd_text)),
        ("mm.0.bias", (n_embd_text,)),
        ("mm.2.weight", (n_embd_text, n_embd_text)),
        ("mm.2.bias", (n_embd_text,)),
    ]
    for name, ggml_shape in specs:
        np_shape = tuple(reversed(ggml_shape))
        if len(ggml_shape) == 1:
            if name.endswith(".weight") and ("ln" in name):
                arr = np.ones(np_shape, dtype=np.float32)
            else:
                arr = rng.normal(0.0, 0.02, size=np_shape).astype(np.float32)
        else:
            scale = 1.0 / math.sqrt(ggml_shape[0])
            arr = rng.normal(0.0, scale, size=np_shape).astype(np.float16)
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
