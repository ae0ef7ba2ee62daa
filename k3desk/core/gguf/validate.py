"""Check a Kimi-K3 GGUF shard set from its headers alone, and describe its layout.

:func:`inspect_shard_set` takes any one part (or an unsplit ``.gguf``), finds the
others by name, reads every header (never tensor data) and checks what llama.cpp
b11434, the engine k3desk is tested against, checks when it loads the set, so
problems surface before a multi-minute load fails.  Each rule follows the
engine's own source and says where it comes from:

* ``ggml/src/gguf.cpp`` (``gguf_init_from_reader``): the container -- checked by
  :mod:`k3desk.core.gguf.reader`, and here: rows a whole number of blocks,
  tensors at the offsets the sizes before them give;
* ``src/llama-model-loader.cpp``: the split set (``split.*`` keys, part names,
  tensor counts), duplicate tensors, tensor data within its file, and the types
  keys must have (``GGUFMeta::GKV::get_kv`` refuses a UINT32 key stored as
  anything else);
* ``src/llama-model.cpp`` (``load_hparams``) and ``src/models/kimi-k3.cpp``
  (``load_arch_hparams``): which keys are required, their defaults, per-layer
  arrays, the asserts on layer and expert counts;
* ``src/llama-vocab.cpp``: the tokenizer keys, the tokenizer and pre-tokenizer names it
  knows, duplicate tokens;
* ``src/llama-graph.cpp`` (``build_moe_ffn``) and the kimi-k3 graph: gating functions,
  per-layer expert counts;
* ggml's CPU backend (``ggml-cpu/ggml-cpu.c`` type traits, ``ggml-cpu/ops.cpp``) and
  ``ggml-backend.cpp``: the weight types it can compute with, the norms' epsilon, the
  32-byte start of each mapped buffer;
* ``src/models/kimi-k3.cpp`` (``load_arch_tensors``, :func:`k3arch.loader_tensors`):
  the tensors, required or optional, their alternatives and their shapes, which
  compare as ggml compares them (padded to 4 dimensions with 1s), and the
  tensors the graph cannot do without.

Findings come in three kinds.  A :class:`ValidationError` (raised) is a set no
llama.cpp build can load, or whose layout cannot be known: a missing or cut
part, a corrupt header, split keys that disagree, shapes that contradict the
file's own hyper-parameters.  ``suspicious`` findings (in the report) are sets
whose files are whole and consistent but which b11434's kimi-k3 loader
refuses: tensors it requires missing, tensors it does not use, tensor types it
does not know.  A llama.cpp fork may load those (that is what forks change),
so such a set can still be launched, with the finding shown; the engine's own
load is the final word.  ``notes`` are oddities llama.cpp does not mind.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

from k3desk.core.errors import ValidationError
from k3desk.core.gguf.ggml import BY_ID
from k3desk.core.gguf.ggml import BY_NAME as BY_ID_NAME
from k3desk.core.gguf.model import (
    K3HParams,
    ModelLayout,
    TensorEntry,
    hparams_from_shape,
    layer_layouts,
)
from k3desk.core.gguf.reader import (
    ARRAY,
    BOOL,
    FLOAT32,
    INT32,
    MAX_KNOWN_SPAN,
    STRING,
    UINT16,
    UINT32,
    VALUE_TYPE_NAMES,
    ArrayRef,
    GGUFHeader,
    StringRef,
    TensorInfo,
    read_header,
)
from k3desk.core.gguf.shards import ShardSet, discover
from k3desk.core.gguf.vocabcache import CheckedVocabularies, Walked, digest
from k3desk.core.k3arch import K3Shape, is_expert_tensor, layer_of, loader_tensors, same_shape
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress
from k3desk.core.safepaths import what_is

ARCH = "kimi-k3"
_P = ARCH + "."
REFERENCE = "llama.cpp b11434"
LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h; load_hparams asserts 0 < block_count <= it
LLAMA_MAX_EXPERTS = 1024  # src/llama-hparams.h ("Kimi K3"); load_hparams asserts it
# enum llama_expert_gating_func_type (src/llama-hparams.h): the values build_moe_ffn
# (src/llama-graph.cpp) handles; NONE (0) and anything else reach GGML_ABORT
# LLAMA_ROPE_SCALING_TYPES (src/llama-model.cpp)
_ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
_GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight", 4: "sqrt_softplus"}

Kind = Literal["u32", "u32s", "f32", "bool", "str"]  # u32s: a UINT32 or a per-layer array

# Every kimi-k3.* key llama.cpp reads, in the order it reads them, with the type it
# insists on and whether the file must have it.  load_hparams (llama-model.cpp):
_HPARAM_KEYS: tuple[tuple[str, Kind, bool], ...] = (
    ("context_length", "u32", True),
    ("embedding_length", "u32", True),
    ("embedding_length_out", "u32", False),
    ("attention.causal", "bool", False),
    ("pooling_type", "u32", False),
    ("classifier.pooling_type", "u32", False),
    ("block_count", "u32", True),
    ("nextn_predict_layers", "u32", False),
    ("expert_count", "u32", False),
    ("expert_used_count", "u32s", False),
    ("expert_group_count", "u32", False),
    ("expert_group_used_count", "u32", False),
    ("feed_forward_length", "u32s", False),
    ("attention.head_count", "u32s", False),
    ("attention.head_count_kv", "u32s", False),
    ("rope.scaling.finetuned", "bool", False),
    ("rope.scaling.original_context_length", "u32", False),
    ("rope.freq_base", "f32", False),
    ("rope.scaling.type", "str", False),
    ("rope.scaling.factor", "f32", False),
    ("rope.scale_linear", "f32", False),
    ("rope.scaling.attn_factor", "f32", False),
    ("rope.scaling.alpha", "f32", False),
    # read only when attention.head_count > 0 (see _hparams)
    ("attention.key_length", "u32", False),
    ("attention.value_length", "u32", False),
    ("rope.dimension_count", "u32", False),
    ("attention.key_length_swa", "u32", False),
    ("attention.value_length_swa", "u32", False),
    ("rope.dimension_count_swa", "u32", False),
    # load_arch_hparams (src/models/kimi-k3.cpp):
    ("attention.layer_norm_rms_epsilon", "f32", True),
    ("attention.key_length_mla", "u32", True),
    ("attention.value_length_mla", "u32", True),
    ("attention.q_lora_rank", "u32", False),
    ("attention.kv_lora_rank", "u32", True),
    ("ssm.conv_kernel", "u32", True),
    ("kda.head_dim", "u32", True),
    ("kda.gate_lower_bound", "f32", False),
    ("expert_feed_forward_length", "u32s", True),
    ("expert_shared_count", "u32", True),
    ("leading_dense_block_count", "u32", False),
    ("expert_weights_scale", "f32", False),
    ("expert_weights_norm", "bool", False),
    ("expert_gating_func", "u32", True),
    ("expert_latent_length", "u32", False),
    ("attn_res.block_size", "u32", True),
    ("activation.situ_beta", "f32", True),
    ("activation.situ_linear_beta", "f32", True),
)
_HEAD_KEYS = frozenset(
    (
        "attention.key_length",
        "attention.value_length",
        "rope.dimension_count",
        "attention.key_length_swa",
        "attention.value_length_swa",
        "rope.dimension_count_swa",
    )
)
# Keys outside kimi-k3.* that the loader and the vocabulary read (general.file_type:
# llama-model-loader.cpp; the rest: llama_vocab::impl::load, llama-vocab.cpp).
_OTHER_KEYS: tuple[tuple[str, Kind, bool], ...] = (
    ("general.name", "str", False),
    ("general.file_type", "u32", False),
    ("tokenizer.ggml.model", "str", True),
    ("tokenizer.ggml.pre", "str", False),
    ("tokenizer.ggml.token_type_count", "u32", False),
    ("tokenizer.ggml.add_space_prefix", "bool", False),
    ("tokenizer.ggml.remove_extra_whitespaces", "bool", False),
    ("tokenizer.ggml.add_bos_token", "bool", False),
    ("tokenizer.ggml.add_eos_token", "bool", False),
    ("tokenizer.ggml.add_sep_token", "bool", False),
    ("tokenizer.ggml.normalizer.lowercase", "bool", False),
    ("tokenizer.ggml.normalizer.strip_accents", "bool", False),
    # the special token ids (special_token_types in llama-vocab.cpp); "seperator" sic
    *((f"tokenizer.ggml.{name}_token_id", "u32", False) for name in (
        "bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask",
        "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep",
        "prefix", "suffix", "middle",
    )),
)  # fmt: skip
# Optional keys whose defaults (load_hparams, load_arch_hparams) change tensor shapes
_SHAPING_KEYS = (
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "rope.dimension_count",
    "leading_dense_block_count",
    "expert_latent_length",
    "expert_count",
)
_KIND_TYPE = {"u32": UINT32, "u32s": UINT32, "f32": FLOAT32, "bool": BOOL, "str": STRING}
# get_arr into std::array<uint32_t, N> (llama-model-loader.cpp) takes these elements
_LAYER_ARRAY_TYPES = (UINT32, INT32, BOOL)
# Tensors b11434 uses as the second operand of ggml_mul / ggml_add / ggml_ssm_conv,
# which its CPU kernels take as F32 only: ggml-cpu/binary-ops.cpp aborts with
# "unsupported types", ggml-cpu/ops.cpp (ssm_conv) asserts src1 is F32.
_F32_ROLES = ("norm", "conv")
F32_ID = 0
I32_ID = 26
TENSOR_ALIGNMENT = 32  # ggml/src/ggml-impl.h
NVFP4_ID = BY_ID_NAME["NVFP4"].id
# Tensors b11434 multiplies by (ggml_mul_mat / ggml_mul_mat_id: the weights) and the
# one it gathers rows from (ggml_get_rows: token_embd).  The CPU backend multiplies by
# a type only through its vec_dot (type_traits_cpu in ggml-cpu/ggml-cpu.c: Q8_1, Q8_K,
# I8, I16, I32, I64 and F64 have none, and ggml_backend_cpu_device_supports_op in
# ggml-cpu.cpp does not stop them, so the load crashes), and gathers rows of the types
# ggml_compute_forward_get_rows (ggml-cpu/ops.cpp) lists, through to_float (Q8_1 has
# none; Q8_K, I8, I16, I64 and F64 reach its GGML_ABORT; I32 rows stay I32, which
# ggml_set_rows in ggml.c refuses when they reach the cache).
_MATMUL_ROLES = ("attn", "odd_row", "dense_ffn", "shexp", "latent", "experts", "router", "output")
_NO_VEC_DOT = frozenset(
    BY_ID_NAME[n].id for n in ("Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64")
)
_NO_GET_ROWS = _NO_VEC_DOT
# tokenizer.ggml.model values llama_vocab::impl::load (llama-vocab.cpp) knows; the BPE
# ones read tokenizer.ggml.pre, which must be one of _PRE_TOKENIZERS (or absent/empty)
_NO_VOCAB = ("no_vocab", "none")
_BPE_MODELS = ("gpt2", "hybriddna", "whitespace", "gemma4")
# tokenizers that need the <0xNN> byte tokens (llama-vocab.cpp: SPM's byte fallback,
# llm_tokenizer_plamo2's table), and the one that adds EOS unless told not to (UGM)
_BYTE_FALLBACK_MODELS = ("llama", "plamo2")
_EOS_BY_DEFAULT = ("t5",)
_EOS_KEY = "tokenizer.ggml.add_eos_token"
_TOKENIZER_MODELS = (*_BPE_MODELS, "llama", "bert", "t5", "rwkv", "test", "plamo2")
_PRE_TOKENIZERS = frozenset((
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
))  # fmt: skip
# a split part's suffix with no name before it ("-00001-of-00003.gguf")
_BARE_SUFFIX = re.compile(r"-\d{5}-of-\d{5}\.gguf")
# the record of vocabularies found free of duplicates, in k3desk's cache folder
APP_VOCABULARIES = CheckedVocabularies()
_CONVERTER_HINT = (
    "The file comes from an incompatible or outdated converter: use a current "
    "conversion (see `k3desk tiers`)."
)


class Tier(Protocol):
    """What the checks ask of a catalog tier (:class:`k3desk.core.catalog.model.Tier`): the
    names of its published parts, for "download it again" advice.  The catalog reads
    GGUF names and types, so this package names only what it needs of it."""

    @property
    def id(self) -> str: ...

    def shard_names(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class ValidationReport:
    layout: ModelLayout
    notes: tuple[str, ...]  # findings that do not stop llama.cpp from loading the set
    # findings on which llama.cpp b11434 refuses the set although its files are whole:
    # an engine built from another llama.cpp checkout may still load it
    suspicious: tuple[str, ...] = ()

    @property
    def loads_in_reference(self) -> bool:
        """Whether llama.cpp b11434 loads this set (it refuses every suspicious one)."""
        return not self.suspicious


def _vtype(h: GGUFHeader, key: str) -> str:
    t = h.kv_types[key]
    if t == ARRAY:
        e = h.elem_type(key)
        return f"an array of {VALUE_TYPE_NAMES[e] if e is not None else '?'}"
    return VALUE_TYPE_NAMES[t]


def _u32(h: GGUFHeader, name: str, default: int | None = None) -> int:
    """The integer key ``<arch>.name`` (``default`` when absent)."""
    v = h.get(_P + name)
    if v is None:
        if default is None:  # the key is required: check_keys has refused it
            raise AssertionError(name)
        return default
    assert isinstance(v, int)
    return int(v)


def _per_layer(h: GGUFHeader, name: str, default: list[int], n_layer: int) -> list[int]:
    """A per-layer key: an array, or one value for every layer (``default`` when absent)."""
    v = h.get(_P + name)
    if v is None:
        return default
    if isinstance(v, list):
        return [int(x) for x in v]
    assert isinstance(v, int)
    return [int(v)] * n_layer


class _Checker:
    def __init__(
        self, shards: ShardSet, tiers: Iterable[Tier], checked: CheckedVocabularies | None
    ) -> None:
        self.shards = shards
        self.tiers = tuple(tiers)
        self.checked = checked
        self.unique: dict[str, str] = {}  # arrays compared, free of duplicates: digests
        self.recorded: set[str] = set()  # arrays the record says are free of duplicates
        self.notes: list[str] = []
        self.suspicious: list[str] = []

    # ------------------------------------------------------------------ messages
    def label(self, i: int) -> str:
        if self.shards.split:
            return f"Part {self.shards.part_label(i)} ({self.shards.part_name(i)})"
        return self.shards.given.name

    def download_hint(self, i: int | None = None, together: bool = False) -> str:
        """What to do: download part ``i`` (or the set) again, naming the tier if known."""
        name = self.shards.part_name(i if i is not None else 0)
        what = "it" if i is not None else "the set"
        where = ""
        if together and self.shards.split:
            where = (
                f"; all {self.shards.count} parts must sit together in "
                f"{self.shards.directory} under their published names"
            )
        for tier in self.tiers:
            if any(Path(n).name == name for n in tier.shard_names()):
                return f"Download {what} again with `k3desk download {tier.id}`{where}."
        return f"Download {what} again from where it came from{where}."

    def fail(self, message: str, i: int | None = None, hint: str | None = None) -> ValidationError:
        return ValidationError(message, hint if hint is not None else self.download_hint(i))

    # ------------------------------------------------------------------ the set
    def check_names(self) -> None:
        s = self.shards
        what = what_is(s.given)
        if what == "missing":
            raise ValidationError(f"{s.given} does not exist.", "Check the path.")
        if what == "a folder":
            raise ValidationError(
                f"{s.given} is a folder.", "Pass the first .gguf part of the model in it."
            )
        if what:
            raise ValidationError(
                f"{s.given} is {what}, not a model file.", "Pass the model's .gguf file."
            )

    def check_numbering(self, h: GGUFHeader) -> ShardSet:
        """The set a file named as no part can be ("-00000-of-", "-00010-of-00009",
        "-00001-of-00000") stands for, from its own header ``h``: llama_model_loader
        (src/llama-model-loader.cpp) reads a name only when the file's split.count is
        above 1, and then llama_get_list_splits asks llama_split_prefix (src/llama.cpp)
        for the name's prefix: the name must end in "-%05d-of-%05d.gguf" with part 1
        and that count, with something before it, or the load fails ("invalid split
        file name"; a split.no other than 0 fails first, "illegal split file idx").
        A whole model (no split.count, or 0 or 1) is loaded by itself, whatever its
        name."""
        s = self.shards
        count = h.get("split.count")
        if count is None or (h.kv_types["split.count"] == UINT16 and count in (0, 1)):
            self.notes.append(
                f"{s.given.name} is named as part {s.given_index + 1} of {s.count}, which no "
                "split set has, but its header says it is the whole model: llama.cpp loads "
                "it alone."
            )
            return s.by_itself()
        said = f"split.count = {count}" if isinstance(count, int) else "a split.count"
        raise ValidationError(
            f"{s.given.name} has an invalid split file name: part {s.given_index + 1} of "
            f"{s.count}, while its header says it belongs to a split set ({said}). "
            "llama.cpp loads a split set from part 1, named <name>-00001-of-NNNNN.gguf "
            "with NNNNN its split.count, and refuses this name (invalid split file name).",
            "Keep the parts under their published names (<name>-00001-of-000NN.gguf) and "
            "pass part 1.",
        )

    def check_missing(self) -> None:
        s = self.shards
        odd = s.not_files()
        if odd:
            i, what = odd[0]
            raise self.fail(
                f"{self.label(i)} is {what}, not a file: {s.paths[i]}.",
                i,
                "Put the part itself there (a regular file), under its published name.",
            )
        missing = s.missing()
        if missing:
            labels = ", ".join(s.part_label(i) for i in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            what = "part" if len(missing) == 1 else "parts"
            raise self.fail(
                f"{what.capitalize()} {labels}{more} of {s.prefix} "
                f"{'is' if len(missing) == 1 else 'are'} missing "
                f"({len(missing)} of {s.count}; expected {s.directory / s.part_name(missing[0])}).",
                missing[0],
                self.download_hint(missing[0], together=True),
            )

    def split_count(self, h0: GGUFHeader) -> int:
        """How many parts part 1's header says the set has (llama_model_loader: the
        other parts are only read when part 1's split.count is above 1)."""
        s = self.shards
        count = h0.get("split.count")
        if count is None:
            n = 1
        elif h0.kv_types["split.count"] != UINT16 or not isinstance(count, int):
            raise self.fail(
                f"{self.label(0)} stores split.count as {_vtype(h0, 'split.count')}; "
                "llama.cpp reads it as UINT16 and refuses the file.",
                0,
                "The set was written by a broken splitter: download it again or "
                "re-split it with llama-gguf-split.",
            )
        else:
            n = count
        if n <= 1:
            if s.split and s.count > 1:
                self.notes.append(
                    f"{s.given.name} is named as part of a {s.count}-part set, but its "
                    "header says it is the whole model: llama.cpp loads it alone."
                )
            return 1
        if not s.split and _BARE_SUFFIX.fullmatch(s.given.name):
            # llama_split_prefix (src/llama.cpp) takes the whole path before the suffix
            # as the name, so "/models/-00001-of-00003.gguf" loads in llama.cpp, but a
            # path given as the bare file name does not: k3desk does not guess
            raise ValidationError(
                f"{s.given.name} is part of a {n}-part set (split.count = {n}), but nothing "
                "comes before -NNNNN-of-NNNNN.gguf in its name: k3desk finds the other "
                "parts by that name.",
                "Rename the parts with a name before the numbers "
                "(<name>-00001-of-000NN.gguf, and the same <name> for every part).",
            )
        if not s.split:
            raise ValidationError(
                f"{s.given.name} is part of a {n}-part set (split.count = {n}) "
                "but its name lacks the -NNNNN-of-NNNNN.gguf suffix llama.cpp needs "
                "to find the other parts.",
                "Keep the parts under their published names.",
            )
        if n != s.count:
            raise self.fail(
                f"{self.label(0)} says split.count = {n}, but its name and the set say "
                f"{s.count} parts: llama.cpp derives the other parts' names from part 1's "
                "name and its split.count, and refuses the set (invalid split file name). "
                "The set mixes files from different uploads, or parts were renamed.",
                0,
            )
        return n

    def check_split_keys(self, headers: list[GGUFHeader]) -> None:
        """The split keys llama_model_loader reads: split.no of every part (part 1's
        with get_key, the others' with gguf_get_val_u16, which asserts UINT16) and
        split.tensors.count of part 1 (an INT32)."""
        s = self.shards
        for i, h in enumerate(headers):
            v = h.get("split.no")
            if v is None:
                raise self.fail(
                    f"{self.label(i)} has no split.no key: it is not a part of a split set.",
                    i,
                )
            if h.kv_types["split.no"] != UINT16 or not isinstance(v, int):
                raise self.fail(
                    f"{self.label(i)} stores split.no as {_vtype(h, 'split.no')}; "
                    "llama.cpp requires UINT16.",
                    i,
                    "The set was written by a broken splitter: download it again or "
                    "re-split it with llama-gguf-split.",
                )
            if v != i:
                raise self.fail(
                    f"{self.label(i)} says split.no = {v} (part {v + 1}), but its name says "
                    f"part {i + 1}: the set mixes files from different uploads, or parts "
                    "were renamed.",
                    i,
                )
            if i == 0:
                continue
            count = h.get("split.count")
            if count is not None and count != s.count:
                self.notes.append(
                    f"{self.label(i)} says split.count = {count} (the set has {s.count} "
                    "parts); llama.cpp reads split.count from part 1 only."
                )
            other = h.get("split.tensors.count")
            if other is not None and other != headers[0].get("split.tensors.count"):
                self.notes.append(
                    f"{self.label(i)} says split.tensors.count = {other}, part 1 says "
                    f"{headers[0].get('split.tensors.count')}; llama.cpp reads part 1's only."
                )
        h0 = headers[0]
        declared = h0.get("split.tensors.count")
        if declared is None:
            raise self.fail(f"{self.label(0)} has no split.tensors.count key.", 0)
        if h0.kv_types["split.tensors.count"] != INT32 or not isinstance(declared, int):
            raise self.fail(
                f"{self.label(0)} stores split.tensors.count as "
                f"{_vtype(h0, 'split.tensors.count')}; llama.cpp reads it as INT32 and "
                "refuses the set.",
                0,
                "The set was written by a broken splitter: download it again or re-split "
                "it with llama-gguf-split.",
            )
        total = sum(len(h.tensors) for h in headers)
        if total != declared:
            raise self.fail(
                f"The {s.count} parts of {s.prefix} hold {total} tensors between them, but "
                f"split.tensors.count says {declared}: llama.cpp refuses the set "
                "(corrupted model).",
                None,
            )

    # ------------------------------------------------------------------ tensors
    def check_tensors(self, headers: list[GGUFHeader]) -> dict[str, int]:
        """Container rules for every tensor; returns the bytes each one takes (for a
        type k3desk does not know, the distance to the next tensor)."""
        seen: dict[str, int] = {}
        sizes: dict[str, int] = {}
        trailing = 0
        unknown: list[str] = []
        for i, h in enumerate(headers):
            expected_rel = 0
            known = True  # offsets can be checked while every type so far is known
            tensors = h.tensors
            for j, t in enumerate(tensors):
                if t.name in seen:
                    where = (
                        "twice in this part"
                        if seen[t.name] == i
                        else f"also in part {self.shards.part_label(seen[t.name])}"
                    )
                    raise self.fail(
                        f"{self.label(i)} contains tensor '{t.name}' {where}: "
                        "duplicate tensors make llama.cpp refuse the set.",
                        i,
                    )
                seen[t.name] = i
                gt = BY_ID.get(t.ggml_type)
                if gt is None:
                    # gguf.cpp refuses a type id >= GGML_TYPE_COUNT or with no block
                    # size (a removed type); a fork may define it
                    unknown.append(f"'{t.name}' (type id {t.ggml_type})")
                    nxt = tensors[j + 1].offset if j + 1 < len(tensors) else h.file_size
                    sizes[t.name] = max(0, nxt - t.offset)
                    known = False
                    continue
                sizes[t.name] = t.nbytes
                if t.shape and t.shape[0] % gt.block_size:
                    raise self.fail(
                        f"{self.label(i)}: tensor '{t.name}' has rows of {t.shape[0]} values, "
                        f"not a multiple of {gt.block_size} as {gt.name} requires: the file "
                        "is corrupt (llama.cpp refuses it).",
                        i,
                    )
                if known and t.rel_offset != expected_rel:
                    raise self.fail(
                        f"{self.label(i)}: tensor '{t.name}' starts at data offset "
                        f"{t.rel_offset:,}, expected {expected_rel:,}: the tensor table is "
                        "corrupt (llama.cpp refuses it).",
                        i,
                    )
                expected_rel = -(-(t.rel_offset + t.nbytes) // h.alignment) * h.alignment
                if t.end > h.file_size:
                    raise self.fail(
                        f"{self.label(i)} is truncated: it has {h.file_size:,} bytes, but "
                        f"tensor '{t.name}' needs bytes up to {t.end:,} "
                        f"({t.end - h.file_size:,} more). The download did not finish.",
                        i,
                        self.download_hint(i).replace("Download it", "Delete it and download it"),
                    )
            trailing += max(0, h.file_size - h.data_end - h.alignment)
            self.check_mapping(i, h)
        if unknown:
            more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
            self.suspicious.append(
                f"Tensor {unknown[0]}{more} has a ggml type {REFERENCE} does not know; "
                "it refuses the set (an engine built for that type may load it)."
            )
        if trailing:
            self.notes.append(
                f"{trailing:,} bytes follow the last tensor of some parts; llama.cpp ignores them."
            )
        return sizes

    def check_mapping(self, i: int, h: GGUFHeader) -> None:
        """llama.cpp maps each file and hands the span of its tensors to the CPU backend
        as a buffer (llama_model::load_tensors, llama-model.cpp: buffer_from_host_ptr at
        the mapping plus the lowest tensor offset, llama_model_loader::get_mapping_range);
        ggml_backend_cpu_buffer_from_ptr (ggml-backend.cpp) asserts that the start is a
        multiple of TENSOR_ALIGNMENT (32, ggml-impl.h).  A file written with a
        general.alignment of 16 or 8 can put its first tensor off that boundary."""
        if not h.tensors or h.alignment % TENSOR_ALIGNMENT == 0:
            return
        first = min(h.tensors, key=lambda t: t.offset)
        if first.offset % TENSOR_ALIGNMENT:
            raise self.fail(
                f"{self.label(i)} has general.alignment = {h.alignment}, and its first tensor "
                f"'{first.name}' starts at byte {first.offset:,}, not a multiple of "
                f"{TENSOR_ALIGNMENT}: llama.cpp maps the file and aborts (buffer pointer "
                "must be aligned).",
                i,
                "The file was written with a non-standard alignment: download a copy written "
                "by llama.cpp's own tools (general.alignment 32).",
            )

    def check_arch(self, h: GGUFHeader) -> None:
        arch = h.get("general.architecture")
        if arch is None:
            raise self.fail(
                f"{self.label(0)} has no general.architecture key: it is not a model file.", 0
            )
        if h.kv_types["general.architecture"] != STRING:
            raise self.fail(
                f"{self.label(0)} stores general.architecture as "
                f"{_vtype(h, 'general.architecture')}, not a string: it is corrupt.",
                0,
            )
        if isinstance(arch, StringRef):  # too long to be an architecture's name
            raise self.fail(
                f"{self.label(0)}: general.architecture is a string of {arch.length:,} bytes: "
                "it is corrupt.",
                0,
            )
        if arch != ARCH:
            raise ValidationError(
                f"{self.label(0)} is a '{arch}' model, not Kimi-K3 ('{ARCH}').",
                "k3desk runs Kimi-K3 GGUF files only: pick one of the tiers `k3desk tiers` lists.",
            )

    # ------------------------------------------------------------------ keys
    def key_type(self, h: GGUFHeader, key: str, kind: Kind, n_layer: int = 0) -> None:
        """Refuse ``key`` stored with a type llama.cpp's getter does not take."""
        t = h.kv_types[key]
        if kind == "u32s" and t == ARRAY:
            n = h.array_len(key)
            if h.elem_type(key) not in _LAYER_ARRAY_TYPES:
                raise self.fail(
                    f"{self.label(0)}: {key} is {_vtype(h, key)}; llama.cpp takes a UINT32 "
                    "or an array of UINT32/INT32 per layer, and refuses the file.",
                    0,
                    _CONVERTER_HINT,
                )
            if n != n_layer:
                raise self.fail(
                    f"{self.label(0)}: {key} has {n:,} entries for {n_layer} layers "
                    "(block_count): llama.cpp refuses the file (wrong array length).",
                    0,
                    _CONVERTER_HINT,
                )
            return
        if t != _KIND_TYPE[kind]:
            raise self.fail(
                f"{self.label(0)} stores {key} as {_vtype(h, key)}; llama.cpp reads it as "
                f"{VALUE_TYPE_NAMES[_KIND_TYPE[kind]]} and refuses the file (wrong type).",
                0,
                _CONVERTER_HINT,
            )

    def check_keys(
        self, h: GGUFHeader, keys: Iterable[tuple[str, Kind, bool]], n_layer: int, prefix: str
    ) -> None:
        for name, kind, required in keys:
            key = prefix + name
            if key not in h.kv_types:
                if required:
                    raise self.fail(
                        f"{self.label(0)} lacks the key {key}, which llama.cpp needs to load "
                        "a kimi-k3 model.",
                        0,
                        _CONVERTER_HINT,
                    )
                continue
            self.key_type(h, key, kind, n_layer)

    def check_groups(self, n_expert: int, groups: int, used: int) -> None:
        """The expert-group asserts of load_hparams (llama-model.cpp)."""
        if n_expert > 0:
            ok = groups < n_expert and (
                groups <= 1 or (n_expert % groups == 0 and 0 < used < groups)
            )
        else:
            ok = groups == 0
        if not ok:
            raise self.fail(
                f"{self.label(0)}: {_P}expert_group_count is {groups} (with "
                f"expert_group_used_count {used} and {n_expert} experts): llama.cpp needs "
                "fewer groups than experts and, for more than one group, groups that divide "
                "the experts evenly with 1 to groups - 1 of them used; it aborts on this file.",
                0,
                _CONVERTER_HINT,
            )

    def hparams(self, h: GGUFHeader) -> tuple[K3HParams, K3Shape]:
        """The hyper-parameters as llama.cpp b11434 computes them from the keys,
        defaults included (the vocabulary size is filled in by :meth:`vocab_size`)."""
        n_layer, nextn = self.check_layer_counts(h)
        n_embd = _u32(h, "embedding_length")
        self.check_rope_scaling(h)
        n_expert, used = self.check_experts(h, n_layer, nextn)
        n_dense = _u32(h, "leading_dense_block_count", 0)
        self.check_norm_and_gating(h, moe_layers=n_dense < n_layer - nextn)
        n_ff = _per_layer(h, "feed_forward_length", [0] * n_layer, n_layer)
        heads = _per_layer(h, "attention.head_count", [0] * n_layer, n_layer)
        hkv = _per_layer(h, "attention.head_count_kv", heads, n_layer)  # defaults to head_count
        n_head = heads[0]
        key_length = 0
        if n_head > 0:  # load_hparams reads these only for models with attention heads
            self.check_keys(h, (k for k in _HPARAM_KEYS if k[0] in _HEAD_KEYS), n_layer, _P)
            # (not attention.value_length: kimi-k3 sets the MLA value width to kv_lora_rank)
            key_length = _u32(h, "attention.key_length", n_embd // n_head)
        n_rot = _u32(h, "rope.dimension_count", key_length)
        kv_lora = _u32(h, "attention.kv_lora_rank")
        n_ff_exp = _per_layer(h, "expert_feed_forward_length", [0] * n_layer, n_layer)[0]
        attn_res_bs = _u32(h, "attn_res.block_size")
        latent = _u32(h, "expert_latent_length", 0)
        if n_head > 0:
            self.check_mla_width(h, key_length, hkv, kv_lora + n_rot)
        shape = K3Shape(
            n_embd=n_embd,
            # the kimi-k3 loader creates the layers before the nextn (multi-token
            # prediction) ones: n_layer = hparams.n_layer() = n_layer_all - n_layer_nextn
            n_layer=n_layer - nextn,
            n_head=n_head,
            head_dim_kda=_u32(h, "kda.head_dim"),
            conv_kernel=_u32(h, "ssm.conv_kernel"),
            q_lora_rank=_u32(h, "attention.q_lora_rank", 0),
            kv_lora_rank=kv_lora,
            rope_dim=n_rot,
            key_length_mla=_u32(h, "attention.key_length_mla"),
            value_length_mla=_u32(h, "attention.value_length_mla"),
            n_ff_dense=n_ff[0],
            n_dense_lead=n_dense,
            n_expert=n_expert,
            n_expert_used=max(used),
            n_ff_expert=n_ff_exp,
            n_latent=latent,
            n_expert_shared=_u32(h, "expert_shared_count"),
            n_vocab=0,  # from the vocabulary, below
            context_length=_u32(h, "context_length"),
            mla_layers=frozenset(i for i, v in enumerate(hkv) if v != 0),
            attn_res=attn_res_bs > 0,
            attn_res_block_size=attn_res_bs,
        )
        # n_vocab is 0 in the shape until the vocabulary is read; the header's block
        # count includes the nextn blocks
        return hparams_from_shape(shape, block_count=n_layer, head_count_kv=tuple(hkv)), shape

    def check_layer_counts(self, h: GGUFHeader) -> tuple[int, int]:
        """(block_count, nextn_predict_layers), with the keys' types checked.  block_count
        first: load_hparams asserts its range before reading arrays."""
        first = ("context_length", "embedding_length", "block_count")
        self.check_keys(h, (k for k in _HPARAM_KEYS if k[0] in first), 0, _P)
        n_layer = _u32(h, "block_count")
        if not 0 < n_layer <= LLAMA_MAX_LAYERS:
            raise self.fail(
                f"{self.label(0)}: {_P}block_count is {n_layer:,}; llama.cpp loads 1 to "
                f"{LLAMA_MAX_LAYERS} layers (Kimi-K3 has 93): the header is corrupt.",
                0,
            )
        self.check_keys(h, (k for k in _HPARAM_KEYS if k[0] not in _HEAD_KEYS), n_layer, _P)
        nextn = _u32(h, "nextn_predict_layers", 0)
        if nextn > n_layer:  # load_hparams: GGML_ASSERT(n_layer_nextn <= n_layer_all)
            raise self.fail(
                f"{self.label(0)}: {_P}nextn_predict_layers is {nextn:,} but the model has "
                f"{n_layer} layers: llama.cpp aborts on the file.",
                0,
                _CONVERTER_HINT,
            )
        return n_layer, nextn

    def check_rope_scaling(self, h: GGUFHeader) -> None:
        scaling = h.get(_P + "rope.scaling.type", "linear")
        if scaling not in _ROPE_SCALING_TYPES:
            # load_hparams: llama_rope_scaling_type_from_string, then
            # GGML_ASSERT(rope_scaling_type_train != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED)
            shown = scaling if isinstance(scaling, str) else "a very long string"
            raise self.fail(
                f"{self.label(0)}: {_P}rope.scaling.type is {shown!r}; llama.cpp knows "
                f"{', '.join(_ROPE_SCALING_TYPES)} and aborts on anything else.",
                0,
                _CONVERTER_HINT,
            )

    def check_experts(self, h: GGUFHeader, n_layer: int, nextn: int) -> tuple[int, list[int]]:
        """(expert_count, expert_used_count per layer) after load_hparams' asserts."""
        n_expert = _u32(h, "expert_count", 0)
        used = _per_layer(h, "expert_used_count", [0] * n_layer, n_layer)
        if (
            n_expert > LLAMA_MAX_EXPERTS
            or max(used) > n_expert
            or ((n_expert > 0) != (max(used) > 0))
        ):
            raise self.fail(
                f"{self.label(0)}: {_P}expert_count is {n_expert:,} and expert_used_count "
                f"{max(used):,}: llama.cpp needs 1 to {LLAMA_MAX_EXPERTS} experts with "
                "1 to expert_count of them used per token, and aborts on this file.",
                0,
                _CONVERTER_HINT,
            )
        self.check_groups(
            n_expert, _u32(h, "expert_group_count", 0), _u32(h, "expert_group_used_count", 0)
        )
        n_dense = _u32(h, "leading_dense_block_count", 0)
        # llama_model_kimi_k3's graph selects the experts of every MoE layer with
        # hparams.n_expert_used(), layer 0's entry of a per-layer array, and
        # build_moe_ffn (llama-graph.cpp) then sums hparams.n_expert_used(il) of them:
        # a layer that sums none, or more than were selected, crashes the engine
        wrong = (
            [i for i in range(n_dense, n_layer - nextn) if not 0 < used[i] <= used[0]]
            if n_expert > 0
            else []
        )
        if wrong:
            self.suspicious.append(
                f"{_P}expert_used_count is {used[wrong[0]]} for layer {wrong[0]} and "
                f"{used[0]} for layer 0: {REFERENCE}'s kimi-k3 graph selects layer 0's "
                "count of experts in every MoE layer and adds up each layer's own count, "
                "so a layer with none or more than layer 0's crashes it."
            )
        return n_expert, used

    def check_norm_and_gating(self, h: GGUFHeader, moe_layers: bool) -> None:
        eps = h.get(_P + "attention.layer_norm_rms_epsilon")
        if isinstance(eps, float) and not eps >= 0:
            # ggml-cpu/ops.cpp, ggml_compute_forward_rms_norm_f32: GGML_ASSERT(eps >= 0.0f)
            self.suspicious.append(
                f"{_P}attention.layer_norm_rms_epsilon is {eps}: {REFERENCE}'s CPU "
                "backend asserts that the norm's epsilon is at least 0 and aborts."
            )
        gating = _u32(h, "expert_gating_func")
        if moe_layers and gating not in _GATING_FUNCS:
            # build_moe_ffn (llama-graph.cpp) aborts on a gating function it does not know
            self.suspicious.append(
                f"{_P}expert_gating_func is {gating}: {REFERENCE} routes experts with "
                f"{', '.join(f'{v} ({n})' for v, n in _GATING_FUNCS.items())} only and "
                "aborts on any other value."
            )

    def check_mla_width(
        self, h: GGUFHeader, key_length: int, hkv: list[int], per_token: int
    ) -> None:
        """The MLA layers' K cache row against what they store per token: the latent
        (kv_lora_rank) and the rope part."""
        widths = sorted({key_length * v for v in hkv if v != 0})
        if widths and widths != [per_token]:
            # the K cache is n_embd_head_k * n_head_kv wide (llama-kv-cache.cpp), and
            # ggml_set_rows asserts the rows written into it fit (ggml.c)
            absent = _P + "attention.key_length" not in h.kv
            self.suspicious.append(
                f"{_P}attention.key_length is {key_length}"
                + (" (absent: llama.cpp takes n_embd / head_count)" if absent else "")
                + f", which makes the MLA layers' cache {widths[-1]} values wide, but they "
                f"store kv_lora_rank + rope.dimension_count = {per_token} per token: "
                f"{REFERENCE} aborts on it."
            )

    def vocab_size(self, h: GGUFHeader) -> int:
        """The number of tokens, after the checks llama_vocab::impl::load makes."""
        self.check_keys(h, _OTHER_KEYS, 0, "")
        model = h.get("tokenizer.ggml.model")
        pre = h.get("tokenizer.ggml.pre")
        name = model if isinstance(model, str) else "?"
        if name in _NO_VOCAB:
            # llama_vocab::impl::load returns before reading any token; the vocabulary
            # size is the <arch>.vocab_size key's (0 without it)
            self.check_keys(h, (("vocab_size", "u32", False),), 0, _P)
            self.suspicious.append(
                f"tokenizer.ggml.model is '{name}': the file has no vocabulary for "
                f"{REFERENCE}, which then cannot turn a prompt into tokens."
            )
            size = h.get(_P + "vocab_size", 0)
            return size if isinstance(size, int) else 0
        self.check_tokenizer(h, name, pre)
        self.check_add_eos(h, name)
        # a BPE vocabulary needs its merges, except Kimi-K2's (is_kimi_k2); gemma4 always
        self.tokenizer_array(
            h,
            "tokenizer.ggml.merges",
            (STRING,),
            (name in ("gpt2", "hybriddna", "whitespace") and pre != "kimi-k2") or name == "gemma4",
        )
        n = self.tokenizer_array(h, "tokenizer.ggml.tokens", (STRING,), True) or 0
        for key, types in (
            ("tokenizer.ggml.scores", (INT32, FLOAT32)),
            ("tokenizer.ggml.token_type", (INT32,)),
        ):
            m = self.tokenizer_array(h, key, types, False)
            if m is not None and m < n:
                raise self.fail(
                    f"{self.label(0)}: {key} has {m:,} entries for {n:,} tokens; llama.cpp "
                    "refuses the tokenizer.",
                    0,
                    _CONVERTER_HINT,
                )
        return n

    def tokenizer_array(
        self, h: GGUFHeader, key: str, types: tuple[int, ...], required: bool
    ) -> int | None:
        """The length of the tokenizer array ``key`` (None: absent and not required),
        refused when it is missing but required or holds the wrong type."""
        if key not in h.kv_types:
            if required:
                raise self.fail(
                    f"{self.label(0)} lacks {key}: llama.cpp cannot load the tokenizer.",
                    0,
                    _CONVERTER_HINT,
                )
            return None
        if h.kv_types[key] != ARRAY or h.elem_type(key) not in types:
            raise self.fail(
                f"{self.label(0)} stores {key} as {_vtype(h, key)}; llama.cpp refuses "
                "the tokenizer (invalid gguf type).",
                0,
                _CONVERTER_HINT,
            )
        return h.array_len(key)

    def check_tokenizer(self, h: GGUFHeader, name: str, pre: object) -> None:
        """The tokenizer and pre-tokenizer names llama_vocab::impl::load knows, and the
        byte tokens the byte-fallback tokenizers need."""
        if name not in _TOKENIZER_MODELS:
            self.suspicious.append(
                f"tokenizer.ggml.model is '{name}', a tokenizer {REFERENCE} does not know "
                "(llama_vocab::impl::load: unknown tokenizer); it refuses the file."
            )
        elif name in _BPE_MODELS and name != "gemma4":  # gemma4 sets its own pre-tokenizer
            pre_name = pre if isinstance(pre, str) else "?"
            if pre is not None and pre_name != "" and pre_name not in _PRE_TOKENIZERS:
                self.suspicious.append(
                    f"tokenizer.ggml.pre is '{pre_name}', a pre-tokenizer {REFERENCE} does "
                    "not know (llama_vocab::impl::load: unknown pre-tokenizer type); it "
                    "refuses the file."
                )
        elif name in _BYTE_FALLBACK_MODELS and not self.has_byte_tokens(h):
            # llm_tokenizer_plamo2 (llama-vocab.cpp) throws "Byte token for <0x..> is not
            # set" while loading; the SPM tokenizer ("llama") falls back to those tokens
            # (llama_vocab::byte_to_token, token_to_id.at) for any text not in the
            # vocabulary, and throws on the first prompt
            self.suspicious.append(
                f"tokenizer.ggml.model is '{name}', whose tokenizer falls back to the 256 "
                "byte tokens <0x00>..<0xFF>, but the vocabulary has none (the Kimi-K3 "
                f"vocabulary is byte-level BPE, 'gpt2'): {REFERENCE} fails on it."
            )

    def check_add_eos(self, h: GGUFHeader, name: str) -> None:
        add_eos = h.get("tokenizer.ggml.add_eos_token", name in _EOS_BY_DEFAULT)
        if add_eos is True:
            # llama-completion (tools/completion/completion.cpp) asserts that a model
            # without an encoder does not add EOS; llama-server would end every prompt
            # with the end-of-sequence token
            why = "true" if _EOS_KEY in h.kv else f"absent: the default of '{name}'"
            self.suspicious.append(
                f"The tokenizer adds an end-of-sequence token to every prompt ({_EOS_KEY} "
                f"{why}): {REFERENCE}'s llama-completion refuses such a model, and "
                "llama-server would end every prompt where the model stops."
            )

    @staticmethod
    def has_byte_tokens(h: GGUFHeader) -> bool:
        """Whether the vocabulary holds the 256 byte tokens <0x00>..<0xFF>."""
        key = "tokenizer.ggml.tokens"
        if h.elem_type(key) != STRING:
            return False
        tokens = set(h.array(key))
        return all(f"<0x{b:02X}>" in tokens for b in range(256))

    def check_duplicate_tokens(self, h: GGUFHeader) -> None:
        """llama_vocab::impl::load maps each token's text to its id and asserts that no
        two tokens share a text (GGML_ASSERT(id_to_token.size() == token_to_id.size()),
        llama-vocab.cpp); an empty token counts as "[EMPTY_<id>]"."""
        key = "tokenizer.ggml.tokens"
        if h.get("tokenizer.ggml.model") in _NO_VOCAB or h.elem_type(key) != STRING:
            return  # llama.cpp reads no token (see vocab_size)
        seen = (h.array_digests or {}).get(key)
        if seen is not None and self.checked is not None and self.checked.known(seen):
            self.recorded.add(key)
            return  # these very bytes were found free of duplicates (vocabcache)
        buf = h.array_bytes(key)
        dup = h.first_duplicate(key, buf)
        if dup is None:
            self.unique[key] = digest(buf)
        else:
            j, i, word = dup
            raise self.fail(
                f"{self.label(0)}: tokens {j:,} and {i:,} of tokenizer.ggml.tokens are both "
                f"{word.decode('utf-8', 'replace')!r}: llama.cpp aborts on a vocabulary with "
                "a duplicate token.",
                0,
                _CONVERTER_HINT,
            )

    def keep_walked(self, h: GGUFHeader) -> None:
        """Keep part 1's long string arrays that were walked (the tokens with their
        verdict), so that the next check of the same bytes neither walks nor compares
        them (:mod:`k3desk.core.gguf.vocabcache`)."""
        if self.checked is None:
            return
        known = h.array_digests or {}
        new: list[Walked] = []
        for key, v in h.kv.items():
            if not isinstance(v, ArrayRef) or v.elem_type != STRING or key in self.recorded:
                continue
            unique = key in self.unique  # compared now and found free of duplicates
            if key in known and not unique:
                continue  # in the record already
            start, end = (h.array_offsets or {})[key], (h.array_ends or {})[key]
            if end - start <= MAX_KNOWN_SPAN:
                sha = self.unique.get(key) or known.get(key) or digest(h.array_bytes(key))
                new.append(Walked(v.count, end - start, sha, unique))
        if new:
            self.checked.add(*new)

    def check_tensor_set(self, headers: list[GGUFHeader], shape: K3Shape) -> None:
        tensors: dict[str, tuple[int, TensorInfo]] = {
            t.name: (i, t) for i, h in enumerate(headers) for t in h.tensors
        }
        created: set[str] = set()
        missing: list[str] = []
        not_f32: list[str] = []
        no_kernel: list[str] = []
        out = tensors.get("output.weight")
        nvfp4_out = out is not None and out[1].ggml_type == NVFP4_ID
        for spec in loader_tensors(shape, tensors.__contains__, nvfp4_out):
            found = tensors.get(spec.name)
            if found is None:
                if spec.required:
                    missing.append(spec.name)
                continue
            created.add(spec.name)
            i, t = found
            # ssm_conv (ggml-cpu/ops.cpp) checks only that the weight's elements are
            # 4 bytes wide (src1->nb[0] == sizeof(float)): I32 passes
            conv_i32 = spec.role == "conv" and t.ggml_type == I32_ID
            if spec.role in _F32_ROLES and t.ggml_type != F32_ID and not conv_i32:
                not_f32.append(f"'{spec.name}' ({t.type_name})")
            if (spec.role in _MATMUL_ROLES and t.ggml_type in _NO_VEC_DOT) or (
                spec.role == "token_embd" and t.ggml_type in _NO_GET_ROWS
            ):
                no_kernel.append(f"'{spec.name}' ({t.type_name})")
            if not same_shape(t.shape, spec.shape):
                raise self.fail(
                    f"{self.label(i)}: tensor '{spec.name}' has shape {list(t.shape)}, but the "
                    f"file's own hyper-parameters call for {list(spec.shape)} "
                    f"(expert_count {shape.n_expert}, embedding_length {shape.n_embd})"
                    f"{self.defaulted(headers[0])}.",
                    i,
                    "The file is inconsistent (an expert pruning that missed a tensor or a "
                    "key?): llama.cpp will refuse it. Download it again or pick another tier.",
                )
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            self.suspicious.append(
                f"{self.shards.prefix} lacks tensor '{missing[0]}'{more}, which {REFERENCE}'s "
                "kimi-k3 loader requires for these hyper-parameters: it refuses the set."
            )
        if not_f32:
            more = f" (and {len(not_f32) - 1} more)" if len(not_f32) > 1 else ""
            self.suspicious.append(
                f"Tensor {not_f32[0]}{more} is not F32: {REFERENCE} takes norms, scores, "
                "biases and convolutions as F32 only (its CPU kernels abort on other types) "
                "and fails on the set."
            )
        if no_kernel:
            more = f" (and {len(no_kernel) - 1} more)" if len(no_kernel) > 1 else ""
            self.suspicious.append(
                f"Tensor {no_kernel[0]}{more} has a type {REFERENCE}'s CPU backend cannot "
                "compute with (no matrix-multiplication or row-gathering kernel for it): "
                "the engine crashes on the set."
            )
        extra = [n for n in tensors if n not in created]
        if extra:
            i, _ = tensors[extra[0]]
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            self.suspicious.append(
                f"{self.label(i)} holds tensor '{extra[0]}'{more}, which {REFERENCE}'s "
                "kimi-k3 loader does not use: it refuses files with tensors it does not use "
                "(wrong number of tensors). A vision tower or another model mixed in?"
            )
        self.check_graph(created, shape)

    @staticmethod
    def defaulted(h: GGUFHeader) -> str:
        """ ", with X absent (llama.cpp takes its default)" for absent keys that shape tensors."""
        absent = [_P + k for k in _SHAPING_KEYS if _P + k not in h.kv]
        if not absent:
            return ""
        return f"; {', '.join(absent)} {'is' if len(absent) == 1 else 'are'} absent, so " + (
            "llama.cpp takes its default" if len(absent) == 1 else "llama.cpp takes defaults"
        )

    def check_graph(self, created: set[str], shape: K3Shape) -> None:
        """Tensors the loader takes as optional but b11434's kimi-k3 graph
        (``llama_model_kimi_k3::graph``) cannot run without."""
        for i in range(shape.n_layer):
            p = f"blk.{i}."
            need: list[tuple[str, str]] = []
            if p + "ffn_gate_shexp.weight" in created:  # the shared expert uses all three
                need += [
                    (p + "ffn_up_shexp.weight", "with ffn_gate_shexp"),
                    (p + "ffn_down_shexp.weight", "with ffn_gate_shexp"),
                ]
            if not shape.is_mla(i) and p + "attn_qkv.weight" in created:
                need.append((p + "attn_q.weight", "(the KDA layers read attn_q/k/v)"))
            if shape.is_mla(i) and p + "attn_kv_b.weight" in created:
                need.append((p + "attn_k_b.weight", "(the MLA cache of K3 needs k_b/v_b)"))
            for name, why in need:
                if name not in created:
                    self.suspicious.append(
                        f"Layer {i} lacks '{name}' {why}: {REFERENCE}'s kimi-k3 graph "
                        "cannot run without it."
                    )
                    return


def _layout(
    shards: ShardSet,
    headers: list[GGUFHeader],
    hp: K3HParams,
    shape: K3Shape,
    sizes: dict[str, int],
) -> ModelLayout:
    entries: list[TensorEntry] = []
    expert = [0] * hp.block_count
    other = [0] * hp.block_count
    global_bytes = 0
    token_embd = 0
    types: Counter[str] = Counter()
    n_layer = hp.block_count
    for i, h in enumerate(headers):
        for t in h.tensors:
            tname = t.type_name
            nbytes = sizes[t.name]
            types[tname] += 1
            entries.append(TensorEntry(t.name, t.shape, t.ggml_type, tname, t.offset, nbytes, i))
            layer = layer_of(t.name)
            if layer is None or not 0 <= layer < n_layer:
                global_bytes += nbytes
                if t.name == "token_embd.weight":
                    token_embd = nbytes
            elif is_expert_tensor(t.name):
                expert[layer] += nbytes
            else:
                other[layer] += nbytes
    # (hp.leading_dense_block_count is shape.n_dense_lead: both read from this header)
    layers = layer_layouts(shape, expert, other)
    name = headers[0].get("general.name", "")
    return ModelLayout(
        architecture=ARCH,
        parts=tuple(h.path for h in headers),
        part_sizes=tuple(h.file_size for h in headers),
        hparams=hp,
        layers=layers,
        global_bytes=global_bytes,
        token_embd_bytes=token_embd,
        tensor_count=len(entries),
        type_counts=dict(types),
        name=name if isinstance(name, str) else "",
        tensors=tuple(entries),
    )


def inspect_shard_set(
    path: Path | str,
    *,
    tiers: Iterable[Tier] = (),
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    checked: CheckedVocabularies | None = APP_VOCABULARIES,
) -> ValidationReport:
    """Validate the set ``path`` belongs to; return its layout and findings.

    Raises :class:`ValidationError` for a set no llama.cpp build can load; a
    set llama.cpp b11434 refuses but whose files are whole comes back with
    ``suspicious`` findings.  ``tiers`` (the catalog) only improves the advice
    in error messages: a part recognised as a tier's gets "download it again
    with `k3desk download <tier>`".  ``checked``: the vocabularies already found
    free of duplicate tokens (k3desk's cache folder by default; None: compare the
    tokens every time).
    """
    shards = discover(path)
    chk = _Checker(shards, tiers, checked)
    chk.check_names()
    if not shards.numbered:
        try:
            given = read_header(shards.given)
        except ValidationError as exc:
            raise ValidationError(exc.message, chk.download_hint()) from None
        shards = chk.shards = chk.check_numbering(given)
    if not (shards.directory / shards.part_name(0)).is_file():
        chk.check_missing()  # part 1 is what llama.cpp opens first

    def read(i: int) -> GGUFHeader:
        if cancel is not None:
            cancel.raise_if_cancelled()
        p = shards.directory / shards.part_name(i)
        progress(Progress("Reading headers", i, shards.count, p.name))
        try:
            return read_header(p, known=chk.checked if i == 0 else None)
        except ValidationError as exc:
            raise ValidationError(
                f"Part {shards.part_label(i)}: {exc.message}" if shards.split else exc.message,
                chk.download_hint(i).replace("Download it", "Delete it and download it"),
            ) from None

    headers = [read(0)]
    n_split = chk.split_count(headers[0])
    if n_split > 1:
        chk.check_missing()
        headers += [read(i) for i in range(1, n_split)]
    progress(Progress("Reading headers", shards.count, shards.count))
    if n_split > 1:
        chk.check_split_keys(headers)
    chk.check_arch(headers[0])
    sizes = chk.check_tensors(headers)
    hp, shape = chk.hparams(headers[0])
    n_vocab = chk.vocab_size(headers[0])
    hp, shape = replace(hp, vocab_size=n_vocab), replace(shape, n_vocab=n_vocab)
    chk.check_tensor_set(headers, shape)
    chk.check_duplicate_tokens(headers[0])  # after the shapes: token_embd bounds the count
    chk.keep_walked(headers[0])
    return ValidationReport(
        _layout(shards, headers, hp, shape, sizes), tuple(chk.notes), tuple(chk.suspicious)
    )


def validate_shard_set(
    path: Path | str,
    *,
    tiers: Iterable[Tier] = (),
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    checked: CheckedVocabularies | None = APP_VOCABULARIES,
) -> ModelLayout:
    """The layout of the shard set ``path`` belongs to; ValidationError if no llama.cpp
    build can load it (see :func:`inspect_shard_set` for the suspicious kind)."""
    report = inspect_shard_set(path, tiers=tiers, progress=progress, cancel=cancel, checked=checked)
    return report.layout
