"""The mutation corpus: variants of llama.cpp-written Kimi-K3 sets, judged twice.

Every variant is loaded by llama.cpp (``llama-completion -m ... -n 1``, see
:mod:`tests.oracle.llama`) and checked by k3desk (``inspect_shard_set``).  The
verdicts agree when k3desk passes exactly the variants llama.cpp loads: a
variant llama.cpp loads must not be refused or flagged (a false refusal), and
one it refuses must be refused or flagged suspicious by k3desk.

    python -m tests.oracle.corpus [DIR] [--full] [--jobs=N] [--only=CATEGORY] [-v]

builds the sets (kept in DIR for the next run), judges the fast sample the test
suite runs, or with ``--full`` every variant (about 2,000; the constructed ones
come from :mod:`tests.oracle.construct`), ``N`` loads at a time (default: one per
core), and prints the agreement table (docs/measured.md shows the full run's).
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from k3desk.core.errors import ValidationError
from k3desk.core.gguf.ggml import BY_ID, BY_NAME
from k3desk.core.gguf.validate import inspect_shard_set
from tests.oracle import gguf_edit as ge
from tests.oracle.construct import CONSTRUCTED, SAMPLE_EVERY, Constructed
from tests.oracle.gguf_edit import GGUF, KV, Tensor
from tests.oracle.llama import STEM, OracleSets, Verdict, llama_loads

BASE_TYPE = "Q4_K_M"
CATEGORIES = (
    "written by llama.cpp's tools",
    "optional tensors dropped",
    "alternative and extra tensors",
    "required tensors dropped",
    "shapes changed",
    "dtypes changed",
    "keys removed",
    "keys retyped",
    "split sets damaged",
    "experts pruned",
    "found by an independent corpus",
    *CONSTRUCTED,
)

Writer = Callable[[Path], Path]  # writes the variant into a folder, returns what -m takes


@dataclass(frozen=True)
class Variant:
    category: str
    name: str
    write: Writer
    sampled: bool = True  # in the fast sample the test suite runs


@dataclass(frozen=True)
class Result:
    variant: Variant
    llama: Verdict
    k3desk: str  # "ok", "suspicious" or "refused"
    message: str

    @property
    def agrees(self) -> bool:
        return self.llama.loads == (self.k3desk == "ok")

    @property
    def false_refusal(self) -> bool:
        return self.llama.loads and self.k3desk != "ok"


# ---------------------------------------------------------------- helpers
def nbytes(dims: tuple[int, ...], ttype: int) -> int:
    """Bytes of a tensor, by k3desk's own type table (what the dtype variants test)."""
    t = BY_ID[ttype]
    n = 1
    for d in dims:
        n *= d
    return n // t.block_size * t.type_size


def zeros(name: str, dims: tuple[int, ...], ttype: int) -> Tensor:
    """A tensor of zero data, as large as ``dims`` of ``ttype`` take."""
    return Tensor(name, dims, ttype, bytes(nbytes(dims, ttype)))


def reshaped(t: Tensor, dims: tuple[int, ...], ttype: int | None = None) -> Tensor:
    """``t`` with new dims (and type): zero data of the size those need."""
    return zeros(t.name, dims, t.ttype if ttype is None else ttype)


def single(g: GGUF) -> Writer:
    def write(d: Path) -> Path:
        return ge.save(g, d / f"{STEM}-{BASE_TYPE}.gguf")

    return write


def existing(first: Path) -> Writer:
    """A set already on disk, as it is."""

    def write(_d: Path) -> Path:
        return first

    return write


def split_of(
    parts: list[GGUF], names: list[str] | None = None, raw: dict[int, bytes] | None = None
) -> Writer:
    """Write a split set; ``names`` renames the files, ``raw`` replaces a part's bytes."""

    def write(d: Path) -> Path:
        n = len(parts)
        want = names or [f"{STEM}-{BASE_TYPE}-{i + 1:05d}-of-{n:05d}.gguf" for i in range(n)]
        paths = []
        for i, (g, name) in enumerate(zip(parts, want, strict=True)):
            p = d / name
            if raw is not None and i in raw:
                p.write_bytes(raw[i])
            else:
                ge.save(g, p)
            paths.append(p)
        return paths[0]

    return write


def _set_split(
    parts: list[GGUF], key: str, value: int, vtype: int, only: int | None = None
) -> list[GGUF]:
    return [
        g.set(KV.of(key, vtype, value)) if only is None or i == only else g
        for i, g in enumerate(parts)
    ]


# ---------------------------------------------------------------- the corpus
MOE_LAYERS = (1, 2, 3, 4, 5)
DENSE, KDA, MLA = 0, 1, 2  # blk.0: KDA + dense FFN; blk.1: KDA + MoE; blk.2: MLA + MoE
SHEXP = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
EXPERT_TENSORS = (
    "ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_up_exps.weight",
    "ffn_gate_inp.weight", "exp_probs_b.bias",
)  # fmt: skip
DTYPES = (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",
    "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "Q2_0",
)  # fmt: skip
F32, F16 = BY_NAME["F32"].id, BY_NAME["F16"].id


class _Corpus:
    """Builds the variants of one llama.cpp-written base (and its 3-part split)."""

    def __init__(self, sets: OracleSets) -> None:
        self.sets = sets
        self.base = ge.load(sets.quantized[BASE_TYPE])
        self.parts = [ge.load(p) for p in sets.by_count[BASE_TYPE]]
        self.out: list[Variant] = []
        self.category = ""

    def add(self, name: str, write: Writer) -> None:
        self.out.append(Variant(self.category, name, write))

    def one(self, name: str, g: GGUF) -> None:
        self.add(name, single(g))

    def t(self, name: str) -> Tensor:
        return self.base.tensor(name)

    def kv(self, key: str) -> KV:
        kv = self.base.kv(key)
        assert kv is not None, key
        return kv

    def build(self) -> list[Variant]:
        for category, make in zip(CATEGORIES, (
            self.written, self.optional, self.alternatives, self.required, self.shapes,
            self.dtypes, self.keys_removed, self.keys_retyped, self.splits, self.experts,
            self.found,
        ), strict=False):  # fmt: skip
            self.category = category
            make()
        counts: dict[str, int] = {}

        def constructed(category: str, name: str, g: GGUF) -> None:
            i = counts[category] = counts.get(category, -1) + 1
            self.out.append(Variant(category, name, single(g), i % SAMPLE_EVERY == 0))

        Constructed(self.base, constructed).build()
        return self.out

    # the sets as llama.cpp's tools wrote them
    def written(self) -> None:
        for label, set_parts in self.sets.all_sets():
            self.add(label, existing(set_parts[0]))

    # optional tensors dropped (TENSOR_NOT_REQUIRED in kimi-k3.cpp)
    def optional(self) -> None:
        b = self.base
        for i in (2, 5):
            self.one(f"blk.{i}.attn_gate dropped", b.drop(f"blk.{i}.attn_gate.weight"))
        self.one(
            "every attn_gate dropped", b.drop("blk.2.attn_gate.weight", "blk.5.attn_gate.weight")
        )
        for i in MOE_LAYERS:
            self.one(f"blk.{i}.ffn_routed_norm dropped", b.drop(f"blk.{i}.ffn_routed_norm.weight"))
        every = [f"blk.{i}.ffn_routed_norm.weight" for i in MOE_LAYERS]
        self.one("every ffn_routed_norm dropped", b.drop(*every))
        for i in MOE_LAYERS:
            self.one(
                f"blk.{i} shared expert dropped", b.drop(*[f"blk.{i}.{x}.weight" for x in SHEXP])
            )
        every = [f"blk.{i}.{x}.weight" for i in MOE_LAYERS for x in SHEXP]
        self.one("every shared expert dropped", b.drop(*every))
        for i, x in ((1, "ffn_gate_shexp"), (3, "ffn_gate_shexp"), (1, "ffn_up_shexp"),
                     (4, "ffn_up_shexp"), (2, "ffn_down_shexp")):  # fmt: skip
            self.one(f"blk.{i}.{x} alone dropped", b.drop(f"blk.{i}.{x}.weight"))
        scores = [t.name for t in b.tensors if "res_score" in t.name]
        no_res = b.set(KV.of("kimi-k3.attn_res.block_size", ge.UINT32, 0))
        self.one("attn_res.block_size 0 and every res score dropped", no_res.drop(*scores))
        self.one("attn_res.block_size 0, res scores kept", no_res)

    # alternative forms the loader accepts, and tensors it does not use
    def alternatives(self) -> None:
        b = self.base
        q = self.t("blk.0.attn_q.weight")
        d_inner = q.dims[1]
        self.one("blk.0.attn_q.bias added", b.put(zeros("blk.0.attn_q.bias", (d_inner,), F32)))
        biased = b
        for x in "qkv":
            biased = biased.put(zeros(f"blk.1.attn_{x}.bias", (d_inner,), F32))
        self.one("blk.1.attn_q/k/v biases added", biased)
        conv = self.t("blk.0.ssm_conv1d_q.weight")
        self.one("blk.0.ssm_conv1d_q stored 4-D", b.put(replace(conv, dims=(*conv.dims, 1))))
        all4 = b
        for t in b.tensors:
            if "ssm_conv1d" in t.name:
                all4 = all4.put(replace(t, dims=(*t.dims, 1)))
        self.one("every conv stored 4-D (as converters write them)", all4)
        self.one("blk.0.attn_q stored [256, 256, 1]", b.put(replace(q, dims=(*q.dims, 1))))
        norm = self.t("blk.0.attn_norm.weight")
        self.one(
            "blk.0.attn_norm stored [256, 1, 1, 1]",
            b.put(replace(norm, dims=(norm.dims[0], 1, 1, 1))),
        )
        fused = b.drop("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight")
        fused = fused.put(zeros("blk.0.attn_qkv.weight", (q.dims[0], 3 * d_inner), q.ttype))
        self.one("blk.0 fused attn_qkv instead of q/k/v", fused)
        kb, vb = self.t("blk.2.attn_k_b.weight"), self.t("blk.2.attn_v_b.weight")
        kv_b = zeros(
            "blk.2.attn_kv_b.weight", (vb.dims[0], kb.dims[2] * (kb.dims[0] + vb.dims[1])), F16
        )
        self.one("blk.2 attn_kv_b instead of k_b/v_b", b.drop(kb.name, vb.name).put(kv_b))
        self.one("blk.2 attn_kv_b beside k_b/v_b", b.put(kv_b))
        # q compression: attn_q_a_norm + attn_q_a + attn_q_b stand for attn_q
        rank = 64
        with_key = b.set(KV.of("kimi-k3.attention.q_lora_rank", ge.UINT32, rank))
        without = b
        for i in (2, 5):
            wq = self.t(f"blk.{i}.attn_q.weight")
            trio = (
                zeros(f"blk.{i}.attn_q_a_norm.weight", (rank,), F32),
                zeros(f"blk.{i}.attn_q_a.weight", (wq.dims[0], rank), wq.ttype),
                zeros(f"blk.{i}.attn_q_b.weight", (rank, wq.dims[1]), F16),
            )
            with_key, without = with_key.drop(wq.name), without.drop(wq.name)
            for t in trio:
                with_key, without = with_key.put(t), without.put(t)
        self.one("q_lora_rank 64: attn_q_a/_b/_a_norm instead of attn_q", with_key)
        self.one("attn_q_a/_b/_a_norm without the q_lora_rank key", without)
        self.one(
            "unknown tensor blk.0.foo.weight added", b.put(zeros("blk.0.foo.weight", (256,), F32))
        )
        patch = zeros("v.patch_embd.weight", (8, 8, 3, 32), F16)
        self.one("a vision tensor v.patch_embd.weight added", b.put(patch))
        extra = replace(self.t("blk.5.attn_norm.weight"), name="blk.6.attn_norm.weight")
        self.one("blk.6.attn_norm added (layer past block_count)", b.put(extra))

    # required tensors dropped, one at a time, from a layer of each kind and the globals
    def required(self) -> None:
        optional = ("attn_gate", "ffn_routed_norm", "shexp")
        for t in self.base.tensors:
            layer = t.name.split(".")[1] if t.name.startswith("blk.") else None
            if layer not in (None, str(DENSE), str(KDA), str(MLA)):
                continue
            if not any(o in t.name for o in optional):
                self.one(f"{t.name} dropped", self.base.drop(t.name))

    # shapes changed (zero data of the new size)
    def shapes(self) -> None:
        def reshape(name: str, dims: tuple[int, ...], label: str) -> None:
            self.one(f"{name} {label} {list(dims)}", self.base.put(reshaped(self.t(name), dims)))

        t = self.t
        e, vocab = t("token_embd.weight").dims
        reshape("token_embd.weight", (e, vocab + 32), "one block of rows more")
        reshape("output.weight", (e, 2 * vocab), "twice the rows")
        reshape("output_norm.weight", (2 * e,), "twice as long")
        reshape("blk.0.attn_q.weight", (e, 2 * e), "twice the rows")
        reshape(
            "blk.0.ssm_f_a.weight", tuple(reversed(t("blk.0.ssm_f_a.weight").dims)), "transposed"
        )
        k, _, d = t("blk.0.ssm_conv1d_k.weight").dims
        reshape("blk.0.ssm_conv1d_k.weight", (k, d), "2-D")
        reshape("blk.0.ssm_conv1d_v.weight", (k, 2, d // 2), "regrouped")
        reshape("blk.0.ssm_a", (8,), "twice the heads")
        reshape("blk.0.ffn_gate.weight", (e, 2 * e), "twice as wide")
        lat, ff, n = t("blk.1.ffn_gate_exps.weight").dims
        reshape("blk.1.ffn_gate_exps.weight", (lat, ff, n + 1), "one expert more")
        reshape("blk.1.ffn_gate_inp.weight", (e, n + 1), "one expert more")
        reshape("blk.1.exp_probs_b.bias", (n + 1,), "one expert more")
        nope, rank, heads = t("blk.2.attn_k_b.weight").dims
        reshape("blk.2.attn_k_b.weight", (nope + 8, rank, heads), "wider")
        reshape(
            "blk.2.attn_kv_a_mqa.weight",
            (e, t("blk.2.attn_kv_a_mqa.weight").dims[1] + 1),
            "one row more",
        )
        reshape(
            "blk.2.attn_gate.weight", (e, t("blk.2.attn_gate.weight").dims[1] // 2), "half the rows"
        )
        reshape("blk.1.ffn_routed_norm.weight", (lat // 2,), "half as long")
        reshape("blk.1.ffn_gate_shexp.weight", (e, ff // 2), "half the rows")
        reshape("blk.3.ssm_norm.weight", (t("blk.3.ssm_norm.weight").dims[0] // 2,), "half as long")
        reshape("blk.0.attn_norm.weight", (1, e), "turned")
        reshape("blk.4.ffn_down_exps.weight", (ff, lat // 2, n), "half-width experts")

    # dtypes changed: one 256x256 weight in every type the engine knows, sized by
    # k3desk's type table (llama.cpp refuses the file if a size is wrong), and the
    # tensors whose type the kernels constrain
    def dtypes(self) -> None:
        b, q = self.base, self.t("blk.0.attn_q.weight")
        for name in DTYPES:
            self.one(f"blk.0.attn_q as {name}", b.put(reshaped(q, q.dims, BY_NAME[name].id)))
        exps = self.t("blk.1.ffn_down_exps.weight")
        self.one(
            "blk.1.ffn_down_exps as Q8_0", b.put(reshaped(exps, exps.dims, BY_NAME["Q8_0"].id))
        )
        for name in ("blk.0.attn_norm.weight", "blk.1.exp_probs_b.bias", "blk.0.ssm_a",
                     "output_res_score.weight", "blk.0.ssm_dt.bias", "blk.1.ffn_gate_inp.weight",
                     "blk.0.ssm_conv1d_q.weight", "blk.2.attn_k_b.weight"):  # fmt: skip
            t = self.t(name)
            self.one(f"{name} as F16", b.put(reshaped(t, t.dims, F16)))
        conv = self.t("blk.0.ssm_conv1d_q.weight")
        q8 = Tensor(conv.name, conv.dims, BY_NAME["Q8_0"].id, bytes(34 * conv.dims[2]))
        self.one("blk.0.ssm_conv1d_q as Q8_0 (its rows are 4 long)", b.put(q8))
        fb = self.t("blk.0.ssm_f_b.weight")
        q4 = Tensor(fb.name, fb.dims, BY_NAME["Q4_K"].id, bytes(fb.dims[1] * 144))
        self.one(f"blk.0.ssm_f_b ({fb.dims[0]}-wide rows) as Q4_K", b.put(q4))
        self.one("blk.0.attn_q with type id 99 (unknown)", b.put(replace(q, ttype=99)))
        self.one("blk.0.attn_q with type id 31 (removed Q4_0_4_4)", b.put(replace(q, ttype=31)))

    # keys removed, each one in turn
    def keys_removed(self) -> None:
        for kv in self.base.kvs:
            self.one(f"{kv.key} removed", self.base.drop_key(kv.key))

    # keys retyped
    def keys_retyped(self) -> None:
        b = self.base
        for kv in b.kvs:
            if kv.vtype == ge.UINT32:
                self.one(f"{kv.key} as INT32", b.set(KV.of(kv.key, ge.INT32, kv.scalar())))
            elif kv.vtype == ge.FLOAT32:
                self.one(f"{kv.key} as FLOAT64", b.set(KV.of(kv.key, ge.FLOAT64, kv.scalar())))
            elif kv.vtype == ge.BOOL:
                self.one(f"{kv.key} as UINT8", b.set(KV.of(kv.key, ge.UINT8, int(kv.scalar()))))
        for key in ("kimi-k3.block_count", "kimi-k3.expert_count", "kimi-k3.embedding_length"):
            self.one(f"{key} as UINT64", b.set(KV.of(key, ge.UINT64, self.kv(key).scalar())))
        n_layer = int(self.kv("kimi-k3.block_count").scalar())
        for name in ("attention.head_count", "expert_used_count", "feed_forward_length",
                     "expert_feed_forward_length"):  # fmt: skip
            key = "kimi-k3." + name
            per_layer = [int(self.kv(key).scalar())] * n_layer
            self.one(
                f"{key} as a per-layer UINT32 array",
                b.set(KV.of(key, ge.ARRAY, per_layer, ge.UINT32)),
            )
        heads = "kimi-k3.attention.head_count"
        self.one(
            f"{heads} as a per-layer INT32 array",
            b.set(KV.of(heads, ge.ARRAY, [4] * n_layer, ge.INT32)),
        )
        short = KV.of(heads, ge.ARRAY, [4] * (n_layer - 1), ge.UINT32)
        self.one(f"{heads} as an array of {n_layer - 1} for {n_layer} layers", b.set(short))
        hkv_key = "kimi-k3.attention.head_count_kv"
        _, hkv = self.kv(hkv_key).array()
        for etype, label in ((ge.UINT32, "UINT32"), (ge.INT64, "INT64"), (ge.FLOAT32, "FLOAT32"),
                             (ge.INT16, "INT16")):  # fmt: skip
            vals = [float(str(x)) for x in hkv] if etype == ge.FLOAT32 else hkv
            self.one(f"{hkv_key} as an {label} array", b.set(KV.of(hkv_key, ge.ARRAY, vals, etype)))
        longer = KV.of(hkv_key, ge.ARRAY, [*hkv, 0], ge.INT32)
        self.one(f"{hkv_key} with one entry too many", b.set(longer))
        for v in (0, 1):
            self.one(f"{hkv_key} as the scalar {v}", b.set(KV.of(hkv_key, ge.UINT32, v)))
        tt = self.kv("tokenizer.ggml.token_type")
        as_u32 = KV(tt.key, ge.ARRAY, struct.pack("<I", ge.UINT32) + tt.raw[4:])
        self.one("tokenizer.ggml.token_type as UINT32", b.set(as_u32))
        arch = KV.of("general.architecture", ge.ARRAY, ["kimi-k3"], ge.STRING)
        self.one("general.architecture as an array of strings", b.set(arch))
        for vtype, label in ((ge.UINT32, "UINT32"), (ge.UINT64, "UINT64")):
            aligned = replace(b.set(KV.of("general.alignment", vtype, 64)), alignment=64)
            self.one(f"general.alignment 64 as {label}", aligned)

    # split sets damaged (the 3-part Q4_K_M set llama-gguf-split wrote by tensor count)
    def splits(self) -> None:
        parts = self.parts
        n = len(parts)
        std = [f"{STEM}-{BASE_TYPE}-{i + 1:05d}-of-{n:05d}.gguf" for i in range(n)]

        def dropping(index: int) -> Writer:
            def write(d: Path) -> Path:
                first = split_of(parts)(d)
                (d / std[index]).unlink()
                return first

            return write

        add = self.add
        add("part 2 missing", dropping(1))
        add("part 3 missing", dropping(2))
        add("parts 2 and 3 swapped", split_of(parts, [std[0], std[2], std[1]]))
        add("part 2 copied over part 3", split_of([parts[0], parts[1], parts[1]]))
        add("part 1 copied over part 2", split_of([parts[0], parts[0], parts[2]]))
        p1, p2, p3 = (ge.encode(g) for g in parts)
        add("part 2 cut inside its tensor data", split_of(parts, raw={1: p2[: len(p2) - 4096]}))
        add("part 2 one byte short", split_of(parts, raw={1: p2[:-1]}))
        add("part 3 cut inside its header", split_of(parts, raw={2: p3[:600]}))
        add("part 2 with 1 MiB of trailing bytes", split_of(parts, raw={1: p2 + bytes(1 << 20)}))
        add("part 1 with 100 trailing bytes", split_of(parts, raw={0: p1 + b"x" * 100}))
        for wrong in (n - 1, n + 1):
            add(
                f"part 1 says split.count = {wrong}",
                split_of(_set_split(parts, "split.count", wrong, ge.UINT16, 0)),
            )
        add(
            "part 2 says split.count = 4",
            split_of(_set_split(parts, "split.count", 4, ge.UINT16, 1)),
        )
        total = sum(len(g.tensors) for g in parts)
        for i in (0, 1):
            more = _set_split(parts, "split.tensors.count", total + 1, ge.INT32, i)
            add(f"part {i + 1} says split.tensors.count = total + 1", split_of(more))
        add("part 2 says split.no = 2", split_of(_set_split(parts, "split.no", 2, ge.UINT16, 1)))
        add(
            "part 2 stores split.no as UINT32",
            split_of(_set_split(parts, "split.no", 1, ge.UINT32, 1)),
        )
        add(
            "part 1 stores split.count as INT32",
            split_of(_set_split(parts, "split.count", n, ge.INT32, 0)),
        )
        u16 = _set_split(parts, "split.tensors.count", total, ge.UINT16, 0)
        add("part 1 stores split.tensors.count as UINT16", split_of(u16))
        add(
            "part 1 renamed to an unsplit name",
            split_of(parts, [f"{STEM}-{BASE_TYPE}.gguf", *std[1:]]),
        )
        moved = parts[1].tensors[-1]
        third = replace(parts[2], tensors=[moved, *parts[2].tensors])
        add(
            "a tensor moved from part 2 to part 3",
            split_of([parts[0], parts[1].drop(moved.name), third]),
        )
        dup = _set_split(
            [parts[0], parts[1], parts[2].put(moved)], "split.tensors.count", total + 1, ge.INT32
        )
        add("a tensor in parts 2 and 3 (counts adjusted)", split_of(dup))
        model_keys = [kv for kv in parts[0].kvs if not kv.key.startswith("split.")]
        second = replace(parts[1], kvs=[*model_keys, *parts[1].kvs])
        add("part 2 carries the model's keys too", split_of([parts[0], second, parts[2]]))
        # names no part has (llama_split_prefix, src/llama.cpp); -m gets that name
        for number, count in ((n + 1, n), (0, n), (10, 9)):
            add(
                f"part 1 also named part {number} of {count}",
                self.renamed(parts[0], f"-{number:05d}-of-{count:05d}", split_of(parts)),
            )
        for number, count in ((10, 9), (1, 0)):
            add(
                f"the whole model named part {number} of {count}",
                self.renamed(self.base, f"-{number:05d}-of-{count:05d}"),
            )

    @staticmethod
    def renamed(g: GGUF, suffix: str, beside: Writer | None = None) -> Writer:
        """``g`` as <stem><suffix>.gguf, with the set ``beside`` written next to it."""

        def write(d: Path) -> Path:
            if beside is not None:
                beside(d)
            return ge.save(g, d / f"{STEM}-{BASE_TYPE}{suffix}.gguf")

        return write

    # experts pruned, consistently and not
    def experts(self) -> None:
        b = self.base
        n_expert = int(self.kv("kimi-k3.expert_count").scalar())

        def prune(g: GGUF, keep: int, layers: tuple[int, ...], which: tuple[str, ...]) -> GGUF:
            for i in layers:
                for suffix in which:
                    t = g.tensor(f"blk.{i}.{suffix}")
                    data = t.data[: len(t.data) // t.dims[-1] * keep]  # experts are outermost
                    g = g.put(Tensor(t.name, (*t.dims[:-1], keep), t.ttype, data))
            return g

        def count(g: GGUF, keep: int) -> GGUF:
            return g.set(KV.of("kimi-k3.expert_count", ge.UINT32, keep))

        for keep in (n_expert - 1, n_expert - 2):
            self.one(f"pruned to {keep} experts in every layer, key updated",
                     count(prune(b, keep, MOE_LAYERS, EXPERT_TENSORS), keep))  # fmt: skip
        used = KV.of("kimi-k3.expert_used_count", ge.UINT32, 3)
        self.one(
            "pruned to 2, expert_used_count 3",
            count(prune(b, 2, MOE_LAYERS, EXPERT_TENSORS), 2).set(used),
        )
        keep = n_expert - 1
        self.one("expert_count lowered, tensors kept", count(b, keep))
        self.one("tensors pruned, expert_count kept", prune(b, keep, MOE_LAYERS, EXPERT_TENSORS))
        self.one(
            "one layer left unpruned", count(prune(b, keep, MOE_LAYERS[:-1], EXPERT_TENSORS), keep)
        )
        no_router = tuple(x for x in EXPERT_TENSORS if "gate_inp" not in x)
        self.one(
            "router (ffn_gate_inp) left unpruned",
            count(prune(b, keep, MOE_LAYERS, no_router), keep),
        )
        no_bias = tuple(x for x in EXPERT_TENSORS if "probs" not in x)
        self.one("exp_probs_b left unpruned", count(prune(b, keep, MOE_LAYERS, no_bias), keep))
        no_down = tuple(x for x in EXPERT_TENSORS if "down" not in x)
        partly = prune(prune(b, keep, (1, 2, 4, 5), EXPERT_TENSORS), keep, (3,), no_down)
        self.one("blk.3.ffn_down_exps left unpruned", count(partly, keep))

    # what a corpus made independently of this one found: files llama.cpp loads that
    # k3desk refused or flagged, and files it refuses that k3desk passed
    def found(self) -> None:
        b = self.base
        u32 = ge.UINT32

        def s(key: str, value: bytes | str) -> GGUF:
            return b.set(KV.of(key, ge.STRING, value))

        def strings(key: str, index: int, junk: bytes) -> GGUF:
            kv = self.kv(key)
            items = kv.strings()
            items[index] += junk
            return b.set(KV.of(key, ge.ARRAY, items, ge.STRING))

        self.one("general.name with a byte 0xff", s("general.name", b"Tiny-K3 \xff"))
        self.one("token 300 with a lone byte 0xe4", strings("tokenizer.ggml.tokens", 300, b"\xe4"))
        self.one("merge 10 with a byte 0xc3", strings("tokenizer.ggml.merges", 10, b"\xc3"))
        template = self.kv("tokenizer.chat_template").text()
        self.one("chat template with a byte 0xfe", s("tokenizer.chat_template", template + b"\xfe"))
        self.one("an unknown key named with a byte 0xff", b.set(KV.of("x.\udcff", u32, 1)))
        n_expert = int(self.kv("kimi-k3.expert_count").scalar())
        f32 = Tensor("blk.0.attn_q.scale", (1,), F32, struct.pack("<f", 1.0))
        exps = Tensor(
            "blk.1.ffn_up_exps.scale", (n_expert,), F32, struct.pack("<f", 1.0) * n_expert
        )
        self.one(
            "blk.0.attn_q.scale and blk.1.ffn_up_exps.scale (NVFP4-style)", b.put(f32).put(exps)
        )
        for value in (16, 8):
            for pad in range(0, 32, 8):  # the first layout that puts the data off 32 bytes
                g = b.set(KV.of("general.alignment", u32, value))
                g = replace(g.set(KV.of("x.pad", ge.STRING, "p" * pad)), alignment=value)
                data = sum(-(-len(t.data) // value) * value for t in g.tensors)
                if (len(ge.encode(g)) - data - len(g.extra)) % 32:
                    break
            self.one(f"general.alignment {value}, data laid out to match", g)
        self.one("nextn_predict_layers 1", b.set(KV.of("kimi-k3.nextn_predict_layers", u32, 1)))
        self.one("expert_group_count 3", b.set(KV.of("kimi-k3.expert_group_count", u32, 3)))
        n_layer = int(self.kv("kimi-k3.block_count").scalar())
        used = [0] + [int(self.kv("kimi-k3.expert_used_count").scalar())] * (n_layer - 1)
        self.one(
            "expert_used_count per layer, 0 on the dense layer",
            b.set(KV.of("kimi-k3.expert_used_count", ge.ARRAY, used, u32)),
        )
        for v in (0, 99):
            self.one(f"expert_gating_func {v}", b.set(KV.of("kimi-k3.expert_gating_func", u32, v)))
        llama = s("tokenizer.ggml.model", "llama").drop_key("tokenizer.ggml.scores")
        self.one("tokenizer model 'llama' without scores", llama)
        self.one(
            "tokenizer model 'sentencepiece' (unknown)", s("tokenizer.ggml.model", "sentencepiece")
        )
        self.one("pre-tokenizer 'kimi-k3' (unknown)", s("tokenizer.ggml.pre", "kimi-k3"))
        for model in ("none", "no_vocab"):
            self.one(f"tokenizer model '{model}'", s("tokenizer.ggml.model", model))
        tokens = self.kv("tokenizer.ggml.tokens").strings()
        tokens[301] = tokens[300]
        self.one(
            "token 301 a copy of token 300",
            b.set(KV.of("tokenizer.ggml.tokens", ge.ARRAY, tokens, ge.STRING)),
        )
        q, exps_t = self.t("blk.0.attn_q.weight"), self.t("blk.1.ffn_down_exps.weight")
        self.one("blk.0.attn_q as I16", b.put(reshaped(q, q.dims, BY_NAME["I16"].id)))
        for name in ("Q8_K", "F64"):
            self.one(
                f"blk.1.ffn_down_exps as {name}",
                b.put(reshaped(exps_t, exps_t.dims, BY_NAME[name].id)),
            )


def variants(sets: OracleSets, full: bool = True) -> list[Variant]:
    """Every variant of the corpus, in its categories' order (``full=False``: the
    hand-picked ones and the sample of the constructed ones)."""
    return [v for v in _Corpus(sets).build() if full or v.sampled]


# ---------------------------------------------------------------- judging
def k3desk_verdict(path: Path) -> tuple[str, str]:
    try:
        report = inspect_shard_set(path)
    except ValidationError as exc:
        return "refused", exc.message
    if report.suspicious:
        return "suspicious", report.suspicious[0]
    return "ok", "; ".join(report.notes)


def run_corpus(
    sets: OracleSets,
    bin_dir: Path,
    work: Path,
    only: str | None = None,
    full: bool = False,
    jobs: int | None = None,
) -> list[Result]:
    """Judge every variant both ways and return the results.

    One variant at a time per core: it is written under ``work``, loaded by
    llama.cpp, checked by k3desk, and deleted, so writing overlaps the loads and
    the corpus never takes more than a few files' worth of disk.
    """
    corpus = [v for v in variants(sets, full) if only is None or only in v.category]

    def judge(item: tuple[int, Variant]) -> Result:
        i, v = item
        d = work / f"{i:04d}"
        d.mkdir(parents=True, exist_ok=True)
        try:
            first = v.write(d)
            lv = llama_loads(bin_dir, first)
            verdict, message = k3desk_verdict(first)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        return Result(v, lv, verdict, message)

    with ThreadPoolExecutor(jobs or max(1, os.cpu_count() or 1)) as pool:
        return list(pool.map(judge, enumerate(corpus)))


def table(results: list[Result]) -> str:
    """The agreement table, as Markdown."""
    head = (
        "| Variants | n | llama.cpp loads | llama.cpp refuses | k3desk OK | "
        "k3desk suspicious | k3desk refuses | agree |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = [head]

    def row(label: str, rs: list[Result]) -> str:
        c = [
            len(rs),
            sum(r.llama.loads for r in rs),
            sum(not r.llama.loads for r in rs),
            sum(r.k3desk == "ok" for r in rs),
            sum(r.k3desk == "suspicious" for r in rs),
            sum(r.k3desk == "refused" for r in rs),
            sum(r.agrees for r in rs),
        ]
        return f"| {label} | " + " | ".join(str(x) for x in c) + " |"

    for cat in CATEGORIES:
        rs = [r for r in results if r.variant.category == cat]
        if rs:
            rows.append(row(cat, rs))
    rows.append(row("**all**", results))
    return "\n".join(rows)


def disagreements(results: list[Result]) -> str:
    lines = []
    for r in results:
        if not r.agrees:
            lines.append(
                f"- {r.variant.category} / {r.variant.name}: llama.cpp "
                f"{'loads' if r.llama.loads else 'refuses (' + r.llama.why + ')'}, "
                f"k3desk {r.k3desk}: {r.message}"
            )
    return "\n".join(lines)


def iter_refusals(results: list[Result]) -> Iterator[str]:
    for r in results:
        if not r.llama.loads:
            yield f"{r.variant.name}: {r.llama.why}"


def main(argv: list[str]) -> int:
    from k3desk.core.engines.discovery import package_server
    from tests.oracle.llama import build_sets, load_sets

    server = package_server()
    if server is None:
        print("no llama-server in this venv (bash scripts/setup.sh --test)", file=sys.stderr)
        return 1
    bin_dir = server.parent
    args = [a for a in argv if not a.startswith("-")]
    only = next((a.split("=", 1)[1] for a in argv if a.startswith("--only=")), None)
    root = Path(args[0]) if args else Path(tempfile.mkdtemp(prefix="k3-oracle-"))
    t0 = time.perf_counter()
    if (root / "sets" / "imatrix.gguf").exists() and "--rebuild" not in argv:
        sets = load_sets(root / "sets")
    else:
        shutil.rmtree(root / "sets", ignore_errors=True)
        sets = build_sets(bin_dir, root / "sets")
    t1 = time.perf_counter()
    work = root / "corpus"
    shutil.rmtree(work, ignore_errors=True)
    full = "--full" in argv
    jobs = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--jobs=")), None)
    results = run_corpus(sets, bin_dir, work, only, full=full, jobs=jobs)
    t2 = time.perf_counter()
    print(table(results))
    print()
    print(
        f"sets built in {t1 - t0:.1f} s; {len(results)} variants judged in {t2 - t1:.1f} s, "
        f"{jobs or os.cpu_count()} at a time"
    )
    bad = disagreements(results)
    if bad:
        print("\nDisagreements:\n" + bad)
    if "-v" in argv:
        for r in results:
            print(
                f"{r.variant.category} / {r.variant.name}: llama "
                f"{'loads' if r.llama.loads else 'refuses: ' + r.llama.why}\n"
                f"    k3desk {r.k3desk}: {r.message}"
            )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
