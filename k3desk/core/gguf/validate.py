"""Check a Kimi-K3 GGUF shard set from its headers alone, and describe its layout.

:func:`validate_shard_set` takes any one part (or an unsplit ``.gguf``), finds the
others by name, reads every header (never tensor data) and checks what llama.cpp
will check when it loads the set, so problems surface before a multi-minute load
fails: every part present, ``split.*`` keys consistent, tensor counts adding up,
no duplicate tensors, every part long enough for its tensors, the ``kimi-k3``
architecture with the hyper-parameters the loader needs, and exactly the tensors
(names and shapes) a kimi-k3 model of those hyper-parameters has.

The first problem found is raised as one :class:`ValidationError` that names the
file and says what to do.  On success it returns the :class:`ModelLayout`
planning works from.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from k3desk.core.catalog.model import Tier
from k3desk.core.errors import ValidationError
from k3desk.core.gguf.ggml import BY_ID
from k3desk.core.gguf.model import K3HParams, LayerLayout, ModelLayout, TensorEntry
from k3desk.core.gguf.reader import INT32, UINT16, VALUE_TYPE_NAMES, GGUFHeader, read_header
from k3desk.core.gguf.shards import ShardSet, discover
from k3desk.core.k3arch import REAL_K3, K3Shape, is_expert_tensor, layer_of, tensor_specs
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress

ARCH = "kimi-k3"
_P = ARCH + "."

# Keys whose absence makes llama.cpp refuse the file, or the layout unknowable.
REQUIRED_KEYS = (
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.kv_lora_rank",
    "attention.key_length",
    "attention.value_length",
    "attention.key_length_mla",
    "attention.value_length_mla",
    "rope.dimension_count",
    "ssm.conv_kernel",
    "kda.head_dim",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_count",
    "expert_latent_length",
    "leading_dense_block_count",
    "attn_res.block_size",
)
# Keys the converters write and the loader reads, but whose absence may be covered
# by defaults in some llama.cpp builds: reported as notes, not failures.
EXPECTED_KEYS = (
    "attention.layer_norm_rms_epsilon",
    "expert_weights_scale",
    "expert_weights_norm",
    "expert_gating_func",
    "activation.situ_beta",
    "activation.situ_linear_beta",
)


@dataclass(frozen=True)
class ValidationReport:
    layout: ModelLayout
    notes: tuple[str, ...]  # findings that do not stop llama.cpp from loading the set


@dataclass(frozen=True)
class _FileShape(K3Shape):
    """A K3Shape whose MLA layers come from the file's head_count_kv."""

    mla_layers: frozenset[int] = frozenset()

    def is_mla(self, layer: int) -> bool:
        return layer in self.mla_layers


class _Checker:
    def __init__(self, shards: ShardSet, tiers: Iterable[Tier]) -> None:
        self.shards = shards
        self.tiers = tuple(tiers)
        self.notes: list[str] = []

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

    # ------------------------------------------------------------------ checks
    def check_names(self) -> None:
        s = self.shards
        if not s.given.exists():
            raise ValidationError(f"{s.given} does not exist.", "Check the path.")
        if s.given.is_dir():
            raise ValidationError(
                f"{s.given} is a folder.", "Pass the first .gguf part of the model in it."
            )
        if s.split:
            m_no, m_count = s.given_index + 1, s.count
            if m_count == 0 or m_no == 0 or m_no > m_count:
                raise ValidationError(
                    f"{s.given.name} has an invalid split file name: part {m_no} of {m_count}.",
                    "Keep the parts under their published names (<name>-00001-of-000NN.gguf).",
                )
        missing = s.missing()
        if missing:
            labels = ", ".join(s.part_label(i) for i in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            what = "part" if len(missing) == 1 else "parts"
            raise self.fail(
                f"{what.capitalize()} {labels}{more} of {s.prefix} "
                f"{'is' if len(missing) == 1 else 'are'} missing "
                f"({len(missing)} of {s.count}; expected {s.paths[missing[0]]}).",
                missing[0],
                self.download_hint(missing[0], together=True),
            )

    def check_split_keys(self, headers: list[GGUFHeader]) -> None:
        s = self.shards
        if not s.split:
            count = headers[0].get("split.count")
            if isinstance(count, int) and count > 1:
                raise ValidationError(
                    f"{s.given.name} is part of a {count}-part set (split.count = {count}) "
                    "but its name lacks the -NNNNN-of-NNNNN.gguf suffix llama.cpp needs "
                    "to find the other parts.",
                    "Keep the parts under their published names.",
                )
            return
        for i, h in enumerate(headers):
            for key, want in (("split.count", s.count), ("split.no", i)):
                v = h.get(key)
                if v is None:
                    raise self.fail(
                        f"{self.label(i)} has no {key} key: it is not a part of a split set.",
                        i,
                    )
                if h.kv_types[key] != UINT16 or not isinstance(v, int):
                    raise self.fail(
                        f"{self.label(i)} stores {key} as "
                        f"{VALUE_TYPE_NAMES[h.kv_types[key]]}; llama.cpp requires UINT16.",
                        i,
                        "The set was written by a broken splitter: download it again or "
                        "re-split it with llama-gguf-split.",
                    )
                if v != want:
                    said = (
                        f"split.no = {v} (part {v + 1}), but its name says part {want + 1}"
                        if key == "split.no"
                        else f"split.count = {v}, but its name and the set say {want} parts"
                    )
                    raise self.fail(
                        f"{self.label(i)} says {said}: the set mixes files from different "
                        "uploads, or parts were renamed.",
                        i,
                    )
        declared = headers[0].get("split.tensors.count")
        if not isinstance(declared, int) or isinstance(declared, bool):
            raise self.fail(f"{self.label(0)} has no split.tensors.count key.", 0)
        for i, h in enumerate(headers[1:], start=1):
            other = h.get("split.tensors.count")
            if other is not None and other != declared:
                raise self.fail(
                    f"{self.label(i)} says split.tensors.count = {other}, part 1 says "
                    f"{declared}: the parts come from different uploads.",
                    i,
                )
        total = sum(len(h.tensors) for h in headers)
        if total != declared:
            raise self.fail(
                f"The {s.count} parts of {s.prefix} hold {total} tensors between them, but "
                f"split.tensors.count says {declared}: llama.cpp will refuse the set.",
                None,
            )
        if headers[0].kv_types.get("split.tensors.count") not in (INT32, UINT16):
            self.notes.append(
                "split.tensors.count is not stored as INT32 (gguf-split writes INT32)."
            )

    def check_tensors(self, headers: list[GGUFHeader]) -> None:
        seen: dict[str, int] = {}
        trailing = 0
        for i, h in enumerate(headers):
            expected_rel = 0
            for t in h.tensors:
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
                    raise self.fail(
                        f"{self.label(i)}: tensor '{t.name}' has ggml type {t.ggml_type}, "
                        "which this version of k3desk (and likely of llama.cpp) does not know.",
                        i,
                        "Update k3desk and llama.cpp, or pick a tier with standard types.",
                    )
                if t.shape[0] % gt.block_size:
                    raise self.fail(
                        f"{self.label(i)}: tensor '{t.name}' has rows of {t.shape[0]} values, "
                        f"not a multiple of {gt.block_size} as {gt.name} requires: the file "
                        "is corrupt.",
                        i,
                    )
                if t.rel_offset != expected_rel:
                    raise self.fail(
                        f"{self.label(i)}: tensor '{t.name}' starts at data offset "
                        f"{t.rel_offset:,}, expected {expected_rel:,}: the tensor table is "
                        "corrupt.",
                        i,
                    )
                expected_rel = -(-(t.rel_offset + t.nbytes) // h.alignment) * h.alignment
            for t in h.tensors:
                if t.end > h.file_size:
                    raise self.fail(
                        f"{self.label(i)} is truncated: it has {h.file_size:,} bytes, but "
                        f"tensor '{t.name}' needs bytes up to {t.end:,} "
                        f"({t.end - h.file_size:,} more). The download did not finish.",
                        i,
                        self.download_hint(i).replace("Download it", "Delete it and download it"),
                    )
            trailing += max(0, h.file_size - h.data_end - h.alignment)
        if trailing:
            self.notes.append(
                f"{trailing:,} bytes follow the last tensor of some parts; llama.cpp ignores them."
            )

    def check_arch(self, h: GGUFHeader) -> None:
        arch = h.get("general.architecture")
        if arch is None:
            raise self.fail(
                f"{self.label(0)} has no general.architecture key: it is not a model file.", 0
            )
        if arch != ARCH:
            raise ValidationError(
                f"{self.label(0)} is a '{arch}' model, not Kimi-K3 ('{ARCH}').",
                "k3desk runs Kimi-K3 GGUF files only: pick one of the tiers `k3desk tiers` lists.",
            )

    def hparams(self, h: GGUFHeader) -> tuple[K3HParams, _FileShape]:
        def get_int(key: str) -> int:
            v = h.get(_P + key)
            if v is None:
                raise self.fail(
                    f"{self.label(0)} lacks the key {_P}{key}, which llama.cpp needs to load "
                    "a kimi-k3 model.",
                    0,
                    "The file comes from an incompatible or outdated converter: use a "
                    "current conversion (see `k3desk tiers`).",
                )
            if isinstance(v, bool) or not isinstance(v, int | list):
                raise self.fail(f"{self.label(0)}: {_P}{key} is {v!r}, not an integer.", 0)
            if isinstance(v, list):
                raise self.fail(f"{self.label(0)}: {_P}{key} is an array, not an integer.", 0)
            return v

        for key in REQUIRED_KEYS:
            if key != "attention.head_count_kv":
                get_int(key)
        n_layer = get_int("block_count")
        hkv_raw = h.get(_P + "attention.head_count_kv")
        if isinstance(hkv_raw, int) and not isinstance(hkv_raw, bool):
            hkv = [hkv_raw] * n_layer
        elif isinstance(hkv_raw, list) and all(isinstance(x, int) for x in hkv_raw):
            hkv = [int(x) for x in hkv_raw]
        else:
            raise self.fail(
                f"{self.label(0)} lacks a usable {_P}attention.head_count_kv "
                "(one entry per layer: 0 = KDA, >0 = MLA).",
                0,
            )
        if len(hkv) != n_layer:
            raise self.fail(
                f"{self.label(0)}: {_P}attention.head_count_kv has {len(hkv)} entries for "
                f"{n_layer} layers.",
                0,
            )
        missing_soft = [k for k in EXPECTED_KEYS if _P + k not in h.kv]
        if missing_soft:
            self.notes.append(
                "Keys some llama.cpp builds need are absent: "
                + ", ".join(_P + k for k in missing_soft)
                + "."
            )
        by_name = {t.name: t for t in h.tensors}
        embd = by_name.get("token_embd.weight")
        n_vocab = embd.shape[1] if embd is not None and len(embd.shape) == 2 else 0
        q_lora = h.get(_P + "attention.q_lora_rank", 0)
        n_expert = get_int("expert_count")
        n_shared = get_int("expert_shared_count")
        n_dense = get_int("leading_dense_block_count")
        hp = K3HParams(
            context_length=get_int("context_length"),
            embedding_length=get_int("embedding_length"),
            block_count=n_layer,
            head_count=get_int("attention.head_count"),
            head_count_kv=tuple(hkv),
            kv_lora_rank=get_int("attention.kv_lora_rank"),
            key_length_mla=get_int("attention.key_length_mla"),
            value_length_mla=get_int("attention.value_length_mla"),
            rope_dimension_count=get_int("rope.dimension_count"),
            ssm_conv_kernel=get_int("ssm.conv_kernel"),
            kda_head_dim=get_int("kda.head_dim"),
            expert_count=n_expert,
            expert_used_count=get_int("expert_used_count"),
            expert_feed_forward_length=get_int("expert_feed_forward_length"),
            expert_shared_count=n_shared,
            expert_latent_length=get_int("expert_latent_length"),
            leading_dense_block_count=n_dense,
            vocab_size=n_vocab,
            attn_res_block_size=get_int("attn_res.block_size"),
        )
        if hp.expert_used_count > n_expert:
            raise self.fail(
                f"{self.label(0)}: expert_used_count {hp.expert_used_count} exceeds "
                f"expert_count {n_expert}.",
                0,
            )
        return hp, self._shape(hp, q_lora if isinstance(q_lora, int) else 0)

    def _shape(self, hp: K3HParams, q_lora: int) -> _FileShape:
        return _FileShape(
            n_embd=hp.embedding_length,
            n_layer=hp.block_count,
            n_head=hp.head_count,
            head_dim_kda=hp.kda_head_dim,
            conv_kernel=hp.ssm_conv_kernel,
            q_lora_rank=q_lora,
            kv_lora_rank=hp.kv_lora_rank,
            rope_dim=hp.rope_dimension_count,
            key_length_mla=hp.key_length_mla,
            value_length_mla=hp.value_length_mla,
            n_ff_dense=0,  # filled in by the caller
            n_dense_lead=hp.leading_dense_block_count,
            n_expert=hp.expert_count,
            n_expert_used=hp.expert_used_count,
            n_ff_expert=hp.expert_feed_forward_length,
            n_latent=hp.expert_latent_length,
            n_expert_shared=hp.expert_shared_count,
            n_ff_shexp=REAL_K3.n_ff_shexp,  # replaced from the tensors below
            n_vocab=hp.vocab_size,
            context_length=hp.context_length,
            mla_layers=frozenset(i for i, v in enumerate(hp.head_count_kv) if v > 0),
        )

    def check_tensor_set(self, headers: list[GGUFHeader], shape: _FileShape) -> None:
        tensors = {t.name: (i, t) for i, h in enumerate(headers) for t in h.tensors}
        # widths that are not keys of their own: read them from the tensors
        first_moe = shape.n_dense_lead
        sh = tensors.get(f"blk.{first_moe}.ffn_gate_shexp.weight")
        n_ff_shexp = (
            sh[1].shape[1] // max(shape.n_expert_shared, 1)
            if sh and len(sh[1].shape) == 2
            else shape.n_ff_shexp
        )
        first_mla = min(shape.mla_layers, default=-1)
        gate = first_mla >= 0 and f"blk.{first_mla}.attn_gate.weight" in tensors
        ff_dense = headers[0].get(_P + "feed_forward_length")
        full = replace(
            shape,
            n_ff_shexp=n_ff_shexp,
            attn_gate=gate,
            n_ff_dense=ff_dense if isinstance(ff_dense, int) else 0,
        )
        expected = {s.name: s for s in tensor_specs(full)}
        missing = [n for n in expected if n not in tensors]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise self.fail(
                f"{self.shards.prefix} lacks tensor '{missing[0]}'{more}, which a kimi-k3 "
                f"model with these hyper-parameters has: llama.cpp will refuse to load it.",
                None,
                "The set is incomplete or was made by an incompatible converter. "
                + self.download_hint(),
            )
        extra = [n for n in tensors if n not in expected]
        if extra:
            i, _ = tensors[extra[0]]
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            raise self.fail(
                f"{self.label(i)} holds tensor '{extra[0]}'{more}, which kimi-k3 does not "
                "have: llama.cpp refuses files with tensors it does not use.",
                i,
                "This is not a plain Kimi-K3 conversion (a vision tower or a different model "
                "mixed in?): use the text-model files of a tier from `k3desk tiers`.",
            )
        for name, spec in expected.items():
            i, t = tensors[name]
            if t.shape != spec.shape:
                raise self.fail(
                    f"{self.label(i)}: tensor '{name}' has shape {list(t.shape)}, but the "
                    f"file's own hyper-parameters call for {list(spec.shape)} "
                    f"(expert_count {shape.n_expert}, embedding_length {shape.n_embd}).",
                    i,
                    "The file is inconsistent (an expert pruning that missed a tensor or a "
                    "key?): llama.cpp will refuse it. Download it again or pick another tier.",
                )
        tok = headers[0].array_len("tokenizer.ggml.tokens")
        if tok is not None and tok != shape.n_vocab:
            raise self.fail(
                f"{self.label(0)}: the tokenizer has {tok:,} tokens but token_embd has "
                f"{shape.n_vocab:,} rows.",
                0,
            )


def _layout(
    shards: ShardSet, headers: list[GGUFHeader], hp: K3HParams, shape: _FileShape
) -> ModelLayout:
    entries: list[TensorEntry] = []
    expert = [0] * hp.block_count
    other = [0] * hp.block_count
    global_bytes = 0
    token_embd = 0
    types: Counter[str] = Counter()
    for i, h in enumerate(headers):
        for t in h.tensors:
            tname = t.type_name
            types[tname] += 1
            entries.append(TensorEntry(t.name, t.shape, t.ggml_type, tname, t.offset, t.nbytes, i))
            layer = layer_of(t.name)
            if layer is None or not 0 <= layer < hp.block_count:
                global_bytes += t.nbytes
                if t.name == "token_embd.weight":
                    token_embd = t.nbytes
            elif is_expert_tensor(t.name):
                expert[layer] += t.nbytes
            else:
                other[layer] += t.nbytes
    layers = tuple(
        LayerLayout(
            index=i,
            attention="mla" if shape.is_mla(i) else "kda",
            ffn="dense" if i < hp.leading_dense_block_count else "moe",
            expert_bytes=expert[i],
            other_bytes=other[i],
        )
        for i in range(hp.block_count)
    )
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
) -> ValidationReport:
    """Validate the set ``path`` belongs to; return its layout and non-fatal notes.

    ``tiers`` (the catalog) only improves the advice in error messages: a part
    recognised as a tier's gets "download it again with `k3desk download <tier>`".
    """
    shards = discover(path)
    chk = _Checker(shards, tiers)
    chk.check_names()
    headers: list[GGUFHeader] = []
    for i, p in enumerate(shards.paths):
        if cancel is not None:
            cancel.raise_if_cancelled()
        progress(Progress("Reading headers", i, shards.count, p.name))
        try:
            headers.append(read_header(p))
        except ValidationError as exc:
            raise ValidationError(
                f"Part {shards.part_label(i)}: {exc.message}" if shards.split else exc.message,
                chk.download_hint(i).replace("Download it", "Delete it and download it"),
            ) from None
    progress(Progress("Reading headers", shards.count, shards.count))
    chk.check_split_keys(headers)
    chk.check_arch(headers[0])
    chk.check_tensors(headers)
    hp, shape = chk.hparams(headers[0])
    chk.check_tensor_set(headers, shape)
    return ValidationReport(_layout(shards, headers, hp, shape), tuple(chk.notes))


def validate_shard_set(
    path: Path | str,
    *,
    tiers: Iterable[Tier] = (),
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
) -> ModelLayout:
    """The layout of the shard set ``path`` belongs to; ValidationError if it is unusable."""
    return inspect_shard_set(path, tiers=tiers, progress=progress, cancel=cancel).layout
