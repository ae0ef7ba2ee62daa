"""The corpus by construction: every key the loader reads, every tensor role in every
ggml type, every string with invalid UTF-8, every alignment, every tokenizer name.

:mod:`tests.oracle.corpus` holds the hand-picked variants; this module generates the
rest from enumerations taken from llama.cpp b11434's source, not from k3desk's rules
(so a rule k3desk lacks shows up as a disagreement rather than a missing variant):

* the keys ``load_hparams`` (``src/llama-model.cpp``), ``load_arch_hparams``
  (``src/models/kimi-k3.cpp``) and ``llama_vocab::impl::load`` (``src/llama-vocab.cpp``)
  read, with the type their getter takes: each one retyped to every other GGUF type,
  set to values at and past its range, and (for the per-layer ones) stored as arrays
  of every element type and of the wrong length;
* one tensor of every role the kimi-k3 loader creates, stored in every ggml type of
  ``enum ggml_type`` (``ggml/include/ggml.h``) and in ids it does not have;
* the optional ``.scale`` / ``.input_scale`` tensors of the generic pass of
  ``llama_model_base::load_tensors``;
* every string field, a token, a merge and a key with bytes that are not UTF-8;
* ``general.alignment`` values, with the data laid out to match;
* every ``tokenizer.ggml.model`` and ``tokenizer.ggml.pre`` value ``llama-vocab.cpp``
  knows, and unknown ones; duplicate and empty tokens.

Every variant is judged by the real loader; :data:`SAMPLE_EVERY` picks the fast
sample ``scripts/test.sh`` runs (the full corpus: ``python -m tests.oracle.corpus --full``).
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable
from dataclasses import replace

from k3desk.core.gguf.ggml import BY_ID, BY_NAME
from tests.oracle import gguf_edit as ge
from tests.oracle.gguf_edit import GGUF, KV, Tensor

# One variant in SAMPLE_EVERY of each constructed category runs in the test suite
# (and the first of each): the full corpus runs with --full.
SAMPLE_EVERY = 15

CONSTRUCTED = (
    "every key: retyped",
    "every key: values out of range",
    "per-layer arrays",
    "strings that are not UTF-8",
    "alignment",
    "tokenizer names and contents",
    "every tensor role in every type",
    "scale tensors",
)

P = "kimi-k3."
# (key, the GGUF type its getter takes, the type of a per-layer array's elements or 0)
# load_hparams (llama-model.cpp), in its order:
_HPARAMS = (
    ("context_length", ge.UINT32), ("embedding_length", ge.UINT32),
    ("embedding_length_out", ge.UINT32), ("attention.causal", ge.BOOL),
    ("pooling_type", ge.UINT32), ("block_count", ge.UINT32),
    ("nextn_predict_layers", ge.UINT32), ("expert_count", ge.UINT32),
    ("expert_used_count", ge.UINT32), ("expert_group_count", ge.UINT32),
    ("expert_group_used_count", ge.UINT32), ("feed_forward_length", ge.UINT32),
    ("attention.head_count", ge.UINT32), ("attention.head_count_kv", ge.UINT32),
    ("rope.scaling.finetuned", ge.BOOL), ("rope.scaling.original_context_length", ge.UINT32),
    ("rope.freq_base", ge.FLOAT32), ("rope.scaling.type", ge.STRING),
    ("rope.scaling.factor", ge.FLOAT32), ("rope.scale_linear", ge.FLOAT32),
    ("rope.scaling.attn_factor", ge.FLOAT32), ("rope.scaling.alpha", ge.FLOAT32),
    ("attention.key_length", ge.UINT32), ("attention.value_length", ge.UINT32),
    ("rope.dimension_count", ge.UINT32), ("attention.key_length_swa", ge.UINT32),
    ("attention.value_length_swa", ge.UINT32), ("rope.dimension_count_swa", ge.UINT32),
    # load_arch_hparams (src/models/kimi-k3.cpp)
    ("attention.layer_norm_rms_epsilon", ge.FLOAT32), ("attention.key_length_mla", ge.UINT32),
    ("attention.value_length_mla", ge.UINT32), ("attention.q_lora_rank", ge.UINT32),
    ("attention.kv_lora_rank", ge.UINT32), ("ssm.conv_kernel", ge.UINT32),
    ("kda.head_dim", ge.UINT32), ("kda.gate_lower_bound", ge.FLOAT32),
    ("expert_feed_forward_length", ge.UINT32), ("expert_shared_count", ge.UINT32),
    ("leading_dense_block_count", ge.UINT32), ("expert_weights_scale", ge.FLOAT32),
    ("expert_weights_norm", ge.BOOL), ("expert_gating_func", ge.UINT32),
    ("expert_latent_length", ge.UINT32), ("attn_res.block_size", ge.UINT32),
    ("activation.situ_beta", ge.FLOAT32), ("activation.situ_linear_beta", ge.FLOAT32),
    ("vocab_size", ge.UINT32),
)  # fmt: skip
# get_key_or_arr: a scalar or an array with one entry per layer
PER_LAYER = (
    "expert_used_count", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "expert_feed_forward_length",
)  # fmt: skip
# llama_vocab::impl::load (llama-vocab.cpp) and the loader's general keys
_OTHER = (
    ("general.name", ge.STRING), ("general.file_type", ge.UINT32),
    ("tokenizer.ggml.model", ge.STRING), ("tokenizer.ggml.pre", ge.STRING),
    ("tokenizer.ggml.token_type_count", ge.UINT32),
    ("tokenizer.ggml.add_space_prefix", ge.BOOL),
    ("tokenizer.ggml.remove_extra_whitespaces", ge.BOOL),
    ("tokenizer.ggml.add_bos_token", ge.BOOL), ("tokenizer.ggml.add_eos_token", ge.BOOL),
    ("tokenizer.ggml.add_sep_token", ge.BOOL),
    *((f"tokenizer.ggml.{n}_token_id", ge.UINT32) for n in (
        "bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "cls", "mask",
        "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep",
    )),
    ("tokenizer.chat_template", ge.STRING),
)  # fmt: skip
LOADER_KEYS: tuple[tuple[str, int], ...] = (*((P + k, t) for k, t in _HPARAMS), *_OTHER)

SCALARS = (
    ge.UINT8, ge.INT8, ge.UINT16, ge.INT16, ge.UINT32, ge.INT32, ge.FLOAT32, ge.BOOL,
    ge.UINT64, ge.INT64, ge.FLOAT64,
)  # fmt: skip
# the types a key is retyped to: a narrower and a signed integer, a wider one, a float,
# a bool and a string (every scalar type is an element type in per_layer)
RETYPES = (ge.UINT8, ge.INT32, ge.UINT64, ge.FLOAT32, ge.BOOL, ge.STRING)
TYPE_NAMES = (
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING",
    "ARRAY", "UINT64", "INT64", "FLOAT64",
)  # fmt: skip
_RANGE = {
    ge.UINT8: (0, 255), ge.INT8: (-128, 127), ge.UINT16: (0, 65535),
    ge.INT16: (-32768, 32767), ge.UINT32: (0, 2**32 - 1), ge.INT32: (-(2**31), 2**31 - 1),
    ge.UINT64: (0, 2**64 - 1), ge.INT64: (-(2**63), 2**63 - 1),
}  # fmt: skip

# tokenizer.ggml.model values llama_vocab::impl::load tests, and the pre-tokenizer
# names of its BPE branch (llama-vocab.cpp, b11434)
TOKENIZER_MODELS = (
    "no_vocab", "none", "llama", "bert", "gpt2", "hybriddna", "whitespace", "t5", "rwkv",
    "test", "plamo2", "gemma4",
)  # fmt: skip
PRE_TOKENIZERS = (
    "default", "minicpm5", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
    "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", "deepseek-llm", "deepseek-coder",
    "deepseek-v3", "spark2_5", "youtu", "falcon", "mpt", "starcoder", "gpt-2", "phi-2",
    "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
    "modern-bert", "jais-2", "gemma4", "granite-embed-multi-311m", "mmbert", "sarvam-moe",
    "jina-v1-en", "jina-v2-code", "roberta-bpe", "whitespace", "refact", "command-r",
    "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "qwen35", "stablelm2", "olmo", "dbrx",
    "smaug-bpe", "poro-chat", "chatglm-bpe", "glm4", "glm5", "viking", "jais", "tekken",
    "smollm", "codeshell", "bloom", "gpt3-finnish", "exaone", "exaone4", "exaone-moe",
    "chameleon", "minerva-7b", "megrez", "gpt-4o", "llama4", "kanana2", "talkie",
    "granite-embed-multi-97m", "tiny_aya", "cohere2moe", "superbpe", "trillion",
    "granite-docling", "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder", "hunyuan",
    "hunyuan-dense", "hy_v4", "joyai-llm", "kimi-k2", "ufakzeka", "grok-2", "afmoe",
    "laguna", "minimax-m2", "solar-open", "mellum2",
)  # fmt: skip

# one tensor of each role the kimi-k3 loader creates (blk.0: KDA + dense FFN;
# blk.1: KDA + MoE; blk.2: MLA + MoE)
ROLE_TENSORS = (
    "token_embd.weight", "output.weight", "output_norm.weight", "blk.0.ssm_conv1d_q.weight",
    "blk.0.attn_q.weight", "blk.0.ssm_f_b.weight", "blk.0.ffn_gate.weight",
    "blk.1.ffn_gate_inp.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_routed_down.weight",
    "blk.1.ffn_gate_shexp.weight", "blk.2.attn_k_b.weight",
)  # fmt: skip
# ids enum ggml_type does not have (removed Q4_2/Q4_3, Q4_0_4_4.., GGML_TYPE_COUNT, more)
UNKNOWN_TYPE_IDS = (4, 31, 43, 99)

Add = Callable[[str, GGUF], None]


def _kv(key: str, vtype: int, value: object, elem: int = -1) -> KV:
    return KV.of(key, vtype, value, elem)


def _as(vtype: int, value: object) -> object:
    """``value`` (a number, bool or string) as a value of ``vtype``, kept in range."""
    if vtype == ge.STRING:
        return str(value)
    if vtype == ge.BOOL:
        return bool(value)
    if vtype in (ge.FLOAT32, ge.FLOAT64):
        try:
            return float(value)  # type: ignore[arg-type]
        except ValueError:
            return 1.0
    try:
        n = int(value)  # type: ignore[call-overload]
    except ValueError:
        n = 1
    lo, hi = _RANGE[vtype]
    return min(max(n, lo), hi)


def _value(kv: KV | None) -> object:
    """The value of a scalar or string key (1 for one the file lacks)."""
    if kv is None:
        return 1
    if kv.vtype == ge.STRING:
        return kv.text().decode("utf-8", "replace")
    if kv.vtype == ge.ARRAY:
        _, items = kv.array()
        return items[0] if items else 0
    return kv.scalar()


def _layer(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


class Constructed:
    """The constructed categories, on the base the hand-picked corpus uses."""

    def __init__(self, base: GGUF, add: Callable[[str, str, GGUF], None]) -> None:
        self.base = base
        self._add = add
        n_layer = base.kv(P + "block_count")
        assert n_layer is not None
        self.n_layer = int(n_layer.scalar())

    def build(self) -> None:
        for category, make in zip(CONSTRUCTED, (
            self.retyped, self.out_of_range, self.per_layer, self.not_utf8,
            self.alignment, self.tokenizer, self.tensor_types, self.scales,
        ), strict=True):  # fmt: skip
            make(functools.partial(self._add, category))

    # ------------------------------------------------------------ keys
    def retyped(self, add: Add) -> None:
        """Every key the loader reads, stored as every other GGUF type (added when the
        file lacks it)."""
        b = self.base
        for key, want in LOADER_KEYS:
            kv = b.kv(key)
            value = _value(kv)
            for vtype in RETYPES:
                if (kv is not None and vtype == kv.vtype) or (kv is None and vtype == want):
                    continue
                add(f"{key} as {TYPE_NAMES[vtype]}", b.set(_kv(key, vtype, _as(vtype, value))))
            if key[len(P) :] not in PER_LAYER:
                add(f"{key} as an array of one UINT32", b.set(_kv(key, ge.ARRAY, [1], ge.UINT32)))

    def out_of_range(self, add: Add) -> None:
        """Every numeric key at and past the ends of its range; every string key empty,
        unknown, and very long."""
        b = self.base
        for key, want in LOADER_KEYS:
            kv = b.kv(key)
            vtype = kv.vtype if kv is not None and kv.vtype != ge.ARRAY else want
            value = _value(kv)
            if vtype == ge.STRING:
                for label, text in (("empty", ""), ("unknown", "no-such-value"),
                                    ("64 KiB long", "x" * 65536)):  # fmt: skip
                    add(f"{key} {label}", b.set(_kv(key, ge.STRING, text)))
                continue
            if vtype == ge.BOOL:
                for flag in (False, True):
                    add(f"{key} = {flag}", b.set(_kv(key, ge.BOOL, flag)))
                continue
            if vtype in (ge.FLOAT32, ge.FLOAT64):
                for x in (0.0, -1.0, math.inf, math.nan):
                    add(f"{key} = {x}", b.set(_kv(key, vtype, x)))
                continue
            lo, hi = _RANGE[vtype]
            n = int(value) if isinstance(value, int | float) else 1
            values = sorted({lo, n + 1, 2 * n + 1, hi} - ({n} if kv else set()))
            for v in values:
                if lo <= v <= hi:
                    add(f"{key} = {v}", b.set(_kv(key, vtype, v)))

        # the keys that only make sense together
        def keys(**kw: int) -> GGUF:
            g = b
            for k, v in kw.items():
                g = g.set(_kv(P + k.replace("__", "."), ge.UINT32, v))
            return g

        for groups, used in ((2, 1), (2, 2), (4, 1), (3, 1), (1, 0), (2, 0)):
            add(f"expert_group_count {groups}, expert_group_used_count {used}",
                keys(expert_group_count=groups, expert_group_used_count=used))  # fmt: skip
        last = [t.name for t in b.tensors if t.name.startswith(f"blk.{self.n_layer - 1}.")]
        for nextn in (1, 2):
            first = self.n_layer - nextn
            gone = [t.name for t in b.tensors if _layer(t.name) >= first]
            add(
                f"nextn_predict_layers {nextn}, its layers' tensors dropped",
                keys(nextn_predict_layers=nextn).drop(*gone),
            )
        add("nextn_predict_layers 1, tensors kept", keys(nextn_predict_layers=1))
        add("the last layer's tensors dropped", b.drop(*last))

    def per_layer(self, add: Add) -> None:
        """The per-layer keys as arrays: every element type, every length near the
        layer count, and per-layer values that differ where layers differ."""
        b, n = self.base, self.n_layer
        for name in PER_LAYER:
            key = P + name
            v = _value(b.kv(key))
            kv = b.kv(key)
            row = kv.array()[1] if kv is not None and kv.vtype == ge.ARRAY else [v] * n
            for etype in (*SCALARS, ge.STRING):
                items = [_as(etype, x) for x in row]
                add(
                    f"{key} as an array of {TYPE_NAMES[etype]}",
                    b.set(_kv(key, ge.ARRAY, items, etype)),
                )
            for length in (0, 1, n - 1, n + 1, 2 * n):
                items = (list(row) * 3)[:length]
                add(
                    f"{key} as an array of {length} for {n} layers",
                    b.set(_kv(key, ge.ARRAY, items, ge.INT32)),
                )
            for layer in range(n):
                for x in (0, int(row[layer]) + 1):  # type: ignore[call-overload]
                    items = list(row)
                    items[layer] = x
                    add(f"{key}[{layer}] = {x}", b.set(_kv(key, ge.ARRAY, items, ge.INT32)))

    # ------------------------------------------------------------ strings
    def not_utf8(self, add: Add) -> None:
        """Bytes that are not UTF-8 in every string the file holds: llama.cpp keeps
        strings as bytes."""
        b = self.base
        bad = (b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80\x80")
        for kv in b.kvs:
            if kv.vtype == ge.STRING and kv.key != "general.architecture":
                text = kv.text()
                for i, junk in enumerate(bad):
                    if kv.key == "tokenizer.chat_template":
                        # in the template's text, before or after its code: bytes
                        # inside a {% %} tag would make it a syntax error instead
                        value = junk + text if i % 2 else text + junk
                    else:
                        value = text[:3] + junk + text[3:]
                    add(
                        f"{kv.key} with bytes {junk!r} (#{i})",
                        b.set(KV.of(kv.key, ge.STRING, value)),
                    )
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            arr = b.kv(key)
            assert arr is not None
            items = arr.strings()
            for index in (0, 7, len(items) // 2, len(items) - 1):
                for junk in bad[:3]:
                    changed = list(items)
                    changed[index] = changed[index] + junk
                    add(
                        f"{key}[{index}] + {junk!r}",
                        b.set(KV.of(key, ge.ARRAY, changed, ge.STRING)),
                    )
            two = list(items)
            two[3], two[4] = b"\xfe\xff", b"\xfe\xfe"  # distinct as bytes, alike as text
            add(
                f"{key}: two entries alike but for invalid bytes",
                b.set(KV.of(key, ge.ARRAY, two, ge.STRING)),
            )
        for raw in (b"custom.\xff", b"\xff\xfe", b"general.name\xff"):
            name = raw.decode("utf-8", "surrogateescape")
            add(f"unknown key {raw!r}", b.set(KV.of(name, ge.UINT32, 1)))
            add(f"unknown key {raw!r} with a string value", b.set(KV.of(name, ge.STRING, b"\xff")))
        b2 = b.set(KV.of("custom.\udcff", ge.UINT32, 1)).set(KV.of("custom.\udcfe", ge.UINT32, 2))
        add("two unknown keys alike but for invalid bytes", b2)
        t = b.tensors[-1]
        add(f"tensor {t.name} renamed with a byte 0xff", b.put(replace(t, name=t.name + "\udcff")))
        arch = b.kv("general.architecture")
        assert arch is not None
        add(
            "general.architecture with a byte 0xff",
            b.set(KV.of(arch.key, ge.STRING, b"kimi-k3\xff")),
        )

    # ------------------------------------------------------------ layout
    def alignment(self, add: Add) -> None:
        """general.alignment values, the data laid out to match, with the header
        padded so the data starts on and off a 32-byte boundary."""
        b = self.base
        for value in (1, 2, 4, 8, 16, 32, 64, 128, 256, 4096):
            for pad in range(0, 32, 8):
                g = b.set(KV.of("general.alignment", ge.UINT32, value))
                if pad:
                    g = g.set(KV.of("custom.pad", ge.STRING, "p" * pad))
                add(
                    f"general.alignment {value}, header padded by {pad}",
                    replace(g, alignment=value),
                )
        for value in (0, 3, 48, 100):
            g = b.set(KV.of("general.alignment", ge.UINT32, value))
            add(
                f"general.alignment {value} (not a power of two)",
                replace(g, alignment=max(value, 1)),
            )
        for vtype in (ge.UINT8, ge.UINT16, ge.INT32, ge.UINT64, ge.FLOAT32, ge.STRING):
            g = b.set(KV.of("general.alignment", vtype, _as(vtype, 64)))
            add(f"general.alignment 64 as {TYPE_NAMES[vtype]}", replace(g, alignment=64))

    # ------------------------------------------------------------ tokenizer
    def tokenizer(self, add: Add) -> None:
        """Every tokenizer model and pre-tokenizer llama-vocab.cpp knows, unknown ones,
        and vocabularies with duplicate or empty tokens."""
        b = self.base
        for model in (*TOKENIZER_MODELS, "GPT2", "sentencepiece", "tiktoken", ""):
            add(
                f"tokenizer.ggml.model '{model}'",
                b.set(KV.of("tokenizer.ggml.model", ge.STRING, model)),
            )
            no_scores = b.drop_key("tokenizer.ggml.scores")
            if model in ("llama", "bert", "t5", "rwkv", "plamo2"):
                n = len(self._tokens())
                scores = b.set(KV.of("tokenizer.ggml.scores", ge.ARRAY, [0.0] * n, ge.FLOAT32))
                g = scores.set(KV.of("tokenizer.ggml.model", ge.STRING, model))
                add(f"tokenizer.ggml.model '{model}' with scores", g)
                add(f"tokenizer.ggml.model '{model}' without scores",
                    no_scores.set(KV.of("tokenizer.ggml.model", ge.STRING, model)))  # fmt: skip
        n_vocab = len(self._tokens())
        for model in ("none", "no_vocab"):
            g = b.set(KV.of("tokenizer.ggml.model", ge.STRING, model))
            g = g.set(KV.of(P + "vocab_size", ge.UINT32, n_vocab))
            add(f"tokenizer.ggml.model '{model}' with vocab_size {n_vocab}", g)
        for pre in (*PRE_TOKENIZERS, "kimi-k3", "KIMI-K2", "unknown-pre", ""):
            add(f"tokenizer.ggml.pre '{pre}'", b.set(KV.of("tokenizer.ggml.pre", ge.STRING, pre)))
        tokens = self._tokens()

        def with_tokens(items: list[bytes]) -> GGUF:
            return b.set(KV.of("tokenizer.ggml.tokens", ge.ARRAY, items, ge.STRING))

        for i, j in ((0, 1), (4, 5), (100, 400), (len(tokens) - 2, len(tokens) - 1)):
            dup = list(tokens)
            dup[j] = dup[i]
            add(f"token {j} a copy of token {i}", with_tokens(dup))
        for i in (3, 300):
            empty = list(tokens)
            empty[i] = b""
            add(f"token {i} empty", with_tokens(empty))
            clash = list(empty)
            clash[i + 1] = b"[EMPTY_%d]" % i
            add(f"token {i} empty and token {i + 1} '[EMPTY_{i}]'", with_tokens(clash))
        add("tokens 1 and 2 empty", with_tokens([tokens[0], b"", b"", *tokens[3:]]))
        add("one token fewer", with_tokens(tokens[:-1]))
        add("one token more", with_tokens([*tokens, b"extra"]))

    def _tokens(self) -> list[bytes]:
        kv = self.base.kv("tokenizer.ggml.tokens")
        assert kv is not None
        return kv.strings()

    # ------------------------------------------------------------ tensors
    def tensor_types(self, add: Add) -> None:
        """One tensor of every role in every ggml type (sized by that type) and in ids
        ggml does not have."""
        b = self.base
        for name in ROLE_TENSORS:
            t = b.tensor(name)
            for gt in sorted(BY_ID.values(), key=lambda x: x.id):
                if gt.id == t.ttype:
                    continue
                n = 1
                for d in t.dims:
                    n *= d
                data = bytes(max(n // gt.block_size, 1) * gt.type_size)
                add(f"{name} as {gt.name}", b.put(Tensor(t.name, t.dims, gt.id, data)))
            for tid in UNKNOWN_TYPE_IDS:
                add(f"{name} with type id {tid}", b.put(replace(t, ttype=tid)))

    def scales(self, add: Add) -> None:
        """The optional per-tensor and per-expert scales of the loader's generic pass."""
        b = self.base
        n_expert_kv = b.kv(P + "expert_count")
        assert n_expert_kv is not None
        n_expert = int(n_expert_kv.scalar())
        f32 = BY_NAME["F32"].id
        f16 = BY_NAME["F16"].id

        def scale(name: str, n: int, ttype: int = f32) -> Tensor:
            size = 4 if ttype == f32 else 2
            data = (struct.pack("<f", 1.0) if ttype == f32 else struct.pack("<e", 1.0)) * n
            assert len(data) == size * n
            return Tensor(name, (n,), ttype, data)

        weights = [t.name[: -len(".weight")] for t in b.tensors if t.name.endswith(".weight")]
        per_tensor = (
            "attn_q", "attn_k", "attn_v", "attn_output", "attn_gate", "ffn_gate", "ffn_down",
            "ffn_up", "ffn_gate_shexp", "ffn_down_shexp", "ffn_up_shexp", "ssm_beta",
        )  # fmt: skip
        per_expert = ("ffn_gate_exps", "ffn_down_exps", "ffn_up_exps")
        unscaled = ("ssm_g", "ssm_f_a", "attn_kv_a_mqa", "ffn_gate_inp", "ffn_routed_down")
        for stem in weights:
            base_name = stem.split(".", 2)[-1]
            layer = stem.split(".")[1] if stem.startswith("blk.") else None
            if layer not in ("0", "1", "2"):
                continue
            n = n_expert if base_name in per_expert else 1
            if base_name in per_tensor or base_name in per_expert or base_name in unscaled:
                add(f"{stem}.scale added", b.put(scale(stem + ".scale", n)))
                add(f"{stem}.input_scale added", b.put(scale(stem + ".input_scale", n)))
            if base_name in ("attn_q", "ffn_gate_exps"):
                add(f"{stem}.scale of {n + 1} values", b.put(scale(stem + ".scale", n + 1)))
                add(f"{stem}.scale as F16", b.put(scale(stem + ".scale", n, f16)))
        both = b.put(scale("blk.0.attn_q.scale", 1)).put(scale("blk.1.ffn_up_exps.scale", n_expert))
        add("blk.0.attn_q.scale and blk.1.ffn_up_exps.scale added", both)
        for x in ("scale", "input_scale"):
            add(f"output.{x} added (output not NVFP4)", b.put(scale("output." + x, 1)))
        out = b.tensor("output.weight")
        nv = BY_NAME["NVFP4"]
        n_out = out.dims[0] * out.dims[1]
        nvfp4 = b.put(
            Tensor(out.name, out.dims, nv.id, bytes(n_out // nv.block_size * nv.type_size))
        )
        add("output as NVFP4", nvfp4)
        add("output as NVFP4 with output.scale", nvfp4.put(scale("output.scale", 1)))
        add("output as NVFP4 with output.input_scale", nvfp4.put(scale("output.input_scale", 1)))
        add(
            "blk.0.attn_q.scale in layer 6 (past block_count)",
            b.put(scale("blk.6.attn_q.scale", 1)),
        )
