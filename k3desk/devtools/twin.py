"""Sparse twins of published tiers: every real header, no real data.

``python -m k3desk.devtools twin TIER_ID DIR`` writes a twin of one catalog tier:
the tier's real part count and file names, real GGUF v3 headers with the
``kimi-k3.*`` keys llama.cpp reads, the ``split.*`` keys, the full tensor list of
Kimi-K3 (``k3arch.tensor_specs`` with the real shapes and the tier's expert count
and tensor types) and a stand-in tokenizer of the real vocabulary size.  The
tensor data is a hole: each part is extended with ``truncate``, so a 530 GiB twin
takes a few megabytes of disk and writes in about a second.

The layout is the one the published tiers have, because they were made by
llama.cpp's own tools: tensors in llama-quantize's order (by layer, then by
name), shapes with trailing 1s dropped (3-D convolutions), part 1's keys as
llama-quantize leaves them (``general.quantization_version`` last) followed by
the ``split.*`` keys in the order llama-gguf-split writes them, and only the
``split.*`` keys in the other parts.  A test compares a twin's structure with
what llama-gguf-split writes for the same tensors.

Twins exercise everything that reads headers (validation, layouts, planning, the
downloader's size checks) at the real scale, and llama.cpp runs them: the weights
read back as zeros (the answers are noise), but a twin loads from mmap, renders a
chat prompt (its template and byte-level tokens) and generates tokens at the real
size's memory and paging costs, without the disk reads (holes cost none).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from k3desk.core.catalog.model import Tier
from k3desk.core.gguf.reader import ARRAY, BOOL, FLOAT32, INT32, STRING, UINT16, UINT32
from k3desk.core.gguf.writer import KV, TensorDef, encode_header, encode_kv
from k3desk.core.k3arch import REAL_K3, K3Shape, quantize_order, tensor_specs

# Token ids of the Kimi-K3 tokenizer (GrEarl's card; K2's tiktoken vocabulary).
BOS_ID, EOS_ID, END_OF_MSG_ID, EOT_ID = 163584, 163585, 163586, 163593
N_MERGES = 163_328
ALIGNMENT = 32
# The published size may exceed what the twin's tensors add up to (rounded card
# figures, tensor types we could only guess).  Up to this shortfall is padded.
MAX_SIZE_ERROR = 0.01

BrokenKind = Literal[
    "missing-part",
    "truncated",
    "truncated-header",
    "split-count",
    "wrong-arch",
    "not-gguf",
    "duplicate-tensor",
    "missing-key",
    "expert-count",
]
BROKEN_KINDS: tuple[BrokenKind, ...] = (
    "missing-part",  # one part deleted
    "truncated",  # one part cut short inside its last tensor (an unfinished download)
    "truncated-header",  # one part cut short inside its header
    "split-count",  # part 1's split.count disagrees with its name
    "wrong-arch",  # general.architecture is not kimi-k3
    "not-gguf",  # one part is an HTML error page
    "duplicate-tensor",  # one tensor stored in two parts (counts adjusted to match)
    "missing-key",  # part 1 lacks kimi-k3.attn_res.block_size
    "expert-count",  # kimi-k3.expert_count says 832, the tensors hold 896 experts
)


def twin_shape(tier: Tier) -> K3Shape:
    """The real Kimi-K3 shape with the tier's expert count and expert width."""
    return REAL_K3.with_experts(tier.experts_kept, tier.expert_feed_forward_length)


def twin_tensors(tier: Tier) -> list[TensorDef]:
    """Every tensor of the tier, in llama-quantize's order, with the tier's type for it."""
    specs = {s.name: s for s in tensor_specs(twin_shape(tier))}
    return [
        TensorDef(name, specs[name].shape, tier.type_for(name, specs[name].role))
        for name in quantize_order(list(specs))
    ]


@dataclass(frozen=True)
class _Part:
    path: Path
    tensors: list[TensorDef]
    kvs: list[KV | bytes]


def _split(tensors: list[TensorDef], n: int) -> list[list[TensorDef]]:
    """Split in order into ``n`` non-empty runs of roughly equal bytes."""
    if n > len(tensors):
        raise ValueError(f"cannot split {len(tensors)} tensors into {n} parts")
    sizes = [t.nbytes for t in tensors]
    total = sum(sizes)
    target = total / n
    parts: list[list[TensorDef]] = [[] for _ in range(n)]
    cum = 0
    for t, size in zip(tensors, sizes, strict=True):
        # a tensor goes to the part its midpoint falls in
        idx = min(n - 1, int((cum + size / 2) // target))
        parts[idx].append(t)
        cum += size
    if all(parts):
        return parts
    # a few huge tensors left a part empty: fall back to equal tensor counts
    k, extra = divmod(len(tensors), n)
    out, i = [], 0
    for j in range(n):
        m = k + (1 if j < extra else 0)
        out.append(tensors[i : i + m])
        i += m
    return out


def _k3_kvs(tier: Tier, s: K3Shape, arch: str) -> list[KV | bytes]:
    k = "kimi-k3."
    u32 = UINT32
    kvs: list[KV | bytes] = [
        KV("general.architecture", STRING, arch),
        KV("general.name", STRING, f"Kimi-K3 {tier.name} (sparse twin of {tier.repo})"),
        KV(k + "context_length", u32, s.context_length),
        KV(k + "embedding_length", u32, s.n_embd),
        KV(k + "block_count", u32, s.n_layer),
        KV(k + "feed_forward_length", u32, s.n_ff_dense),
        KV(k + "attention.head_count", u32, s.n_head),
        KV(k + "attention.head_count_kv", ARRAY, s.head_count_kv(), INT32),
        KV(k + "attention.layer_norm_rms_epsilon", FLOAT32, 1e-5),
        KV(k + "attention.kv_lora_rank", u32, s.kv_lora_rank),
        KV(k + "attention.q_lora_rank", u32, s.q_lora_rank),
        KV(k + "rope.dimension_count", u32, s.rope_dim),
        # rope_theta is absent from K3's config; converters record the class default
        KV(k + "rope.freq_base", FLOAT32, 10000.0),
        KV(k + "attention.key_length", u32, s.kv_lora_rank + s.rope_dim),
        KV(k + "attention.value_length", u32, s.kv_lora_rank),
        KV(k + "attention.key_length_mla", u32, s.key_length_mla),
        KV(k + "attention.value_length_mla", u32, s.value_length_mla),
        KV(k + "ssm.conv_kernel", u32, s.conv_kernel),
        KV(k + "kda.head_dim", u32, s.head_dim_kda),
        KV(k + "kda.gate_lower_bound", FLOAT32, -5.0),
        KV(k + "expert_count", u32, s.n_expert),
        KV(k + "expert_used_count", u32, s.n_expert_used),
        KV(k + "expert_feed_forward_length", u32, s.n_ff_expert),
        KV(k + "expert_shared_count", u32, s.n_expert_shared),
        KV(k + "leading_dense_block_count", u32, s.n_dense_lead),
        # the next values do not change the layout; they are plausible stand-ins
        KV(k + "expert_weights_scale", FLOAT32, 1.0),
        KV(k + "expert_weights_norm", BOOL, True),
        KV(k + "expert_gating_func", u32, 2),  # sigmoid
        KV(k + "expert_latent_length", u32, s.n_latent),
        KV(k + "activation.situ_beta", FLOAT32, 8.0),
        KV(k + "activation.situ_linear_beta", FLOAT32, 8.0),
        KV(k + "attn_res.block_size", u32, s.attn_res_block_size),
        KV(k + "vocab_size", u32, s.n_vocab),
        KV("tokenizer.ggml.model", STRING, "gpt2"),
        KV("tokenizer.ggml.pre", STRING, "kimi-k2"),
    ]
    kvs.extend(_tokenizer_entries(s.n_vocab))
    kvs += [
        KV("tokenizer.ggml.bos_token_id", u32, BOS_ID),
        KV("tokenizer.ggml.eos_token_id", u32, END_OF_MSG_ID),
        KV("tokenizer.ggml.eot_token_id", u32, EOT_ID),
        KV("tokenizer.ggml.add_bos_token", BOOL, False),
        KV("tokenizer.chat_template", STRING, _STAND_IN_TEMPLATE),
        KV("general.quantization_version", u32, 2),  # llama-quantize adds it last
    ]
    return kvs


_STAND_IN_TEMPLATE = (
    '{%- for m in messages -%}<|open|>message role="{{ m.role }}"<|sep|>{{ m.content }}'
    "<|close|>message<|sep|><|end_of_msg|>{%- endfor -%}"
    '{%- if add_generation_prompt -%}<|open|>message role="assistant"<|sep|>{%- endif -%}'
)


# the template's markers, special (control) tokens as in K3's tokenizer, so that a prompt
# is a few dozen tokens, not one per byte of markup (ids from K3's reserved range)
_TEMPLATE_TOKENS = {163587: "<|open|>", 163588: "<|sep|>", 163589: "<|close|>"}
# and its words, user-defined tokens (llama.cpp matches them in any text, longest first:
# tokenizer_st_partition in src/llama-vocab.cpp) standing in for K3's BPE merges, which
# spell them in a token or two: a one-line chat renders to about a dozen tokens, and a
# prompt pages in a fifth of the experts instead of most of them
_TEMPLATE_WORDS = {
    163590: 'message role="user"',
    163591: 'message role="assistant"',
    163592: 'message role="system"',
    163594: "message",
}


@lru_cache(maxsize=2)
def _tokenizer_entries(n_vocab: int) -> tuple[bytes, bytes, bytes]:
    """A stand-in vocabulary of the real size (encoded once per process).

    The strings are not K3's (beyond the 256 byte tokens every byte-level BPE has), but
    the arrays have K3's lengths (163,840 tokens, 163,328 merges), so part 1 of a twin
    is as large and as slow to parse as the real one, and a chat renders a prompt.
    """
    special = {BOS_ID: "[BOS]", EOS_ID: "[EOS]", END_OF_MSG_ID: "<|end_of_msg|>",
               EOT_ID: "[EOT]", **_TEMPLATE_TOKENS}  # fmt: skip
    # the first 256 tokens are the 256 bytes in GPT-2's byte-level alphabet (as in K2's
    # tiktoken vocabulary), so that any text tokenizes: llama.cpp's BPE tokenizer drops
    # what no token spells (llm_tokenizer_bpe_session::tokenize), and a prompt of only
    # stand-in names would render to no tokens at all
    alphabet = _byte_alphabet()
    words = _TEMPLATE_WORDS
    tokens = [
        special.get(i) or words.get(i) or (alphabet[i] if i < 256 else f"<t{i}>")
        for i in range(n_vocab)
    ]
    types = [3 if i in special else 4 if i in words else 1 for i in range(n_vocab)]
    merges = [f"<t{i % 256}> <t{i}>" for i in range(min(N_MERGES, n_vocab))]
    return (
        encode_kv(KV("tokenizer.ggml.tokens", ARRAY, tokens, STRING)),
        encode_kv(KV("tokenizer.ggml.token_type", ARRAY, types, INT32)),
        encode_kv(KV("tokenizer.ggml.merges", ARRAY, merges, STRING)),
    )


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character table (``bytes_to_unicode``): byte ``b`` is spelled
    ``_byte_alphabet()[b]``, the printable bytes as themselves."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    out: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def _split_kvs(no: int, count: int, n_tensors: int) -> list[KV | bytes]:
    # the types llama.cpp's split loader insists on, in the order llama-gguf-split
    # leaves them (it sets split.count last, once it knows it: gguf-split.cpp)
    return [
        KV("split.no", UINT16, no),
        KV("split.tensors.count", INT32, n_tensors),
        KV("split.count", UINT16, count),
    ]


def _plan(tier: Tier, directory: Path, arch: str = "kimi-k3") -> list[_Part]:
    s = twin_shape(tier)
    tensors = twin_tensors(tier)
    names = tier.shard_names()
    groups = _split(tensors, len(names))
    parts = []
    for i, (name, group) in enumerate(zip(names, groups, strict=True)):
        kvs: list[KV | bytes] = _k3_kvs(tier, s, arch) if i == 0 else []
        if len(names) > 1:
            # llama-gguf-split appends split.* to part 1's keys; the others have only these
            kvs = [*kvs, *_split_kvs(i, len(names), len(tensors))]
        parts.append(_Part(directory / name, group, kvs))
    return parts


def _write(parts: Sequence[_Part], published: int) -> list[Path]:
    encoded = [encode_header(p.kvs, p.tensors, ALIGNMENT) for p in parts]
    computed = sum(len(h) + d for h, d in encoded)
    shortfall = published - computed
    if shortfall < -MAX_SIZE_ERROR * published:
        raise ValueError(
            f"the tier's tensor types add up to {computed:,} bytes, more than 1 % over the "
            f"published {published:,}: its catalog entry is inconsistent"
        )
    # Pad a shortfall so the apparent size equals the published one: rounded card
    # figures and tensor types we could only guess (llama.cpp promotes some tensors
    # on its own) leave the computed size a little short.  The padding goes after
    # each part's last tensor, where llama.cpp never reads, spread evenly.
    pad = max(shortfall, 0)
    per, rest = divmod(pad, len(parts))
    paths = []
    for i, (part, (header, data_size)) in enumerate(zip(parts, encoded, strict=True)):
        part.path.parent.mkdir(parents=True, exist_ok=True)
        with part.path.open("wb") as f:
            f.write(header)
            f.truncate(len(header) + data_size + per + (rest if i == len(parts) - 1 else 0))
        paths.append(part.path)
    return paths


def _patch_kv(part: _Part, key: str, new: KV | bytes) -> _Part:
    kvs = [new if isinstance(kv, KV) and kv.key == key else kv for kv in part.kvs]
    return _Part(part.path, part.tensors, kvs)


def write_twin(tier: Tier, directory: str | Path) -> list[Path]:
    """Write a sparse twin of ``tier`` into ``directory``; return its parts in order."""
    return _write(_plan(tier, Path(directory)), tier.size_bytes)


def write_broken_twin(
    tier: Tier, directory: str | Path, kind: BrokenKind, part: int | None = None
) -> tuple[list[Path], Path]:
    """A twin with one defect; returns (all part paths, the path that was broken).

    ``part`` (0-based) picks the damaged part; by default the middle one, or part 1
    for the defects only part 1 can have (its keys are the model's).
    """
    d = Path(directory)
    parts = _plan(tier, d, arch="kimi-k9" if kind == "wrong-arch" else "kimi-k3")
    # only part 1's split.count counts for llama.cpp (a later part's is not read)
    at_first = kind in ("wrong-arch", "missing-key", "expert-count", "split-count")
    idx = (0 if at_first else len(parts) // 2) if part is None else part
    n_tensors = len(twin_tensors(tier))
    if kind == "split-count":
        count = len(parts)
        wrong = KV("split.count", UINT16, count - 1 if count > 1 else 2)
        parts[idx] = _patch_kv(parts[idx], "split.count", wrong)
    elif kind == "duplicate-tensor":
        dup = parts[idx - 1].tensors[0] if idx > 0 else parts[idx].tensors[-1]
        parts[idx] = _Part(parts[idx].path, [*parts[idx].tensors, dup], parts[idx].kvs)
        parts = [
            _patch_kv(p, "split.tensors.count", KV("split.tensors.count", INT32, n_tensors + 1))
            for p in parts
        ]
    elif kind == "missing-key":
        p0 = parts[0]
        kvs = [
            kv
            for kv in p0.kvs
            if not (isinstance(kv, KV) and kv.key.endswith("attn_res.block_size"))
        ]
        parts[0] = _Part(p0.path, p0.tensors, kvs)
    elif kind == "expert-count":
        parts[0] = _patch_kv(
            parts[0], "kimi-k3.expert_count", KV("kimi-k3.expert_count", UINT32, 832)
        )
    paths = _write(parts, tier.size_bytes)
    broken = paths[idx]
    if kind == "missing-part":
        broken.unlink()
    elif kind == "truncated":
        # cut the download short in the middle of the part's largest tensor
        header, _ = encode_header(parts[idx].kvs, parts[idx].tensors, ALIGNMENT)
        offset, cut = 0, 0
        biggest = max(t.nbytes for t in parts[idx].tensors)
        for t in parts[idx].tensors:
            if t.nbytes == biggest:
                cut = len(header) + offset + t.nbytes // 2
                break
            offset = -(-(offset + t.nbytes) // ALIGNMENT) * ALIGNMENT
        os.truncate(broken, cut)
    elif kind == "truncated-header":
        header, _ = encode_header(parts[idx].kvs, parts[idx].tensors, ALIGNMENT)
        os.truncate(broken, len(header) // 2)
    elif kind == "not-gguf":
        broken.write_bytes(b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>\n")
    return paths, broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3desk.devtools twin",
        description="Write a sparse twin (real headers, data as holes) of a catalog tier.",
    )
    parser.add_argument("tier", help="tier id from the catalog (see `k3desk tiers`)")
    parser.add_argument("dir", type=Path, help="folder to write into (created if missing)")
    parser.add_argument(
        "--broken", choices=BROKEN_KINDS, help="write a twin with this defect (for tests)"
    )
    args = parser.parse_args(argv)
    from k3desk.core.catalog.loader import load_catalog
    from k3desk.core.errors import K3Error
    from k3desk.core.resources import resources_dir

    try:
        tier = load_catalog(resources_dir() / "catalog.json").get(args.tier)
        if args.broken:
            paths, broken = write_broken_twin(tier, args.dir, args.broken)
            print(f"broken ({args.broken}): {broken}", file=sys.stderr)
        else:
            paths = write_twin(tier, args.dir)
    except K3Error as exc:
        parser.exit(1, f"error: {exc}\n")
    except (OSError, ValueError) as exc:
        parser.exit(1, f"error: {exc}\n")
    for p in paths:
        print(p)
    return 0
