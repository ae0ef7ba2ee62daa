"""Kimi-K3 models of real sizes, quantized by llama.cpp's own tools, for speed measurements.

``python -m k3desk.devtools bench-k3 NAME [--cache DIR]`` builds one of the models
``bench/speed_vs_measured.py`` measures (``BENCH_MODELS``), or a single-type model
the kernel micro-bench uses (``kernel-Q4_K`` ...), and prints its path.

A bench model has the kimi-k3 architecture (KDA + MLA attention, latent MoE, shared
experts, attn-res scores) at a reduced width (``BENCH_SHAPE``: 2,048 wide, 16 heads
of 128, 128 ... 512 routed experts of which 8 are used), so that its files are
0.5 to 7 GB, and the type mix of a published tier (the catalog's ``tensor_types``
and ``tensor_overrides``, e.g. IQ1_S experts with Q4_K elsewhere).

How it is made:

1. a random-weight F16 "pool" model is written with ``POOL_EXPERTS`` routed
   experts per layer (every other tensor at its final shape);
2. ``llama-imatrix`` computes an importance matrix on it when the tier's types
   need one (IQ1_S, IQ1_M and the IQ2/IQ3_XXS types refuse to quantize without);
3. ``llama-quantize`` quantizes it to the tier's types (one ``--tensor-type`` per
   tensor, from ``Tier.type_for``; its own fallbacks apply to rows that are not a
   multiple of the block size);
4. the routed experts are widened to the model's expert count: expert ``e`` of a
   layer is the quantized pool expert ``e % POOL_EXPERTS`` with its rows rotated by
   ``e // POOL_EXPERTS`` (rows are independent in every ggml type, so each copy is
   a valid, different matrix), and the router gets fresh random F32 weights.

Step 4 exists because llama-quantize's IQ1_S search runs at about 2 M weights/s
on two cores: quantizing 27 G expert weights would take four hours, quantizing a
pool of 16 experts takes minutes.  Every byte of a bench model's weights is still
llama-quantize's output, the file is what llama.cpp's loader reads like any other,
and the bytes a token touches are as many as in a model quantized in one go.

Models are cached (by name, shape, tier types and engine build) under the cache
folder; the F16 pool and the un-widened quantized file are deleted as soon as they
are not needed, so the disk holds the finished models only.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from k3desk.core.catalog.model import Tier
from k3desk.core.engines.canary import write_k3_gguf_streamed
from k3desk.core.k3arch import (
    KERNEL_K3,
    REDUCED_K3,
    K3Shape,
    TensorSpec,
    is_expert_tensor,
    tensor_specs,
)

DEFAULT_CACHE = Path.home() / ".cache" / "k3desk-bench"
POOL_EXPERTS = 16
# types llama-quantize refuses without an importance matrix (llama-quant.cpp,
# tensor_requires_imatrix, b11434)
NEEDS_IMATRIX = frozenset({"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS"})

# The reduced Kimi-K3 (its proportions: k3arch.REDUCED_K3).
BENCH_SHAPE = REDUCED_K3


@dataclass(frozen=True)
class BenchModel:
    name: str
    tier: str  # catalog tier whose tensor types the model takes
    n_layer: int
    n_expert: int
    about: str = ""
    # every matrix of this type, straight from the random-weight writer ("F16"), no
    # llama-quantize (``tier`` then names no catalog tier)
    pure: str = ""

    def shape(self) -> K3Shape:
        return replace(BENCH_SHAPE, n_layer=self.n_layer, n_expert=self.n_expert)


# Three sizes (and four published type mixes) that fit a 24 GiB machine, and an
# unquantized F16 model (prompts on F16 experts take other kernels than on quants).
BENCH_MODELS: tuple[BenchModel, ...] = (
    BenchModel("S-grearl", "grearl-iq1s", 8, 64, "IQ1_S experts, Q4_K elsewhere (GrEarl)"),
    BenchModel("M-ud", "vcruz305-ud-iq1s", 16, 192, "IQ1_S experts, Q8_0 elsewhere (UD-IQ1_S)"),
    BenchModel("M-q3ks", "atomicchat-q3ks", 16, 96, "Q3_K everywhere, Q6_K output (Q3_K_S)"),
    BenchModel("L-6block", "6block-iq1s-xs", 24, 512, "IQ1_S experts, IQ4_XS attention (IQ1_S-XS)"),
    BenchModel("S-f16", "", 6, 48, "F16 everywhere (experts too), F32 norms", pure="F16"),
)

# Single-type models for the kernel micro-bench: dense (no experts), every
# matrix of one type (``llama-quantize --pure``), about 0.6 G weights.
KERNEL_SHAPE = KERNEL_K3  # the CPU check times the same model (core/tuning/cpuprobe.py)
# The same with a quarter of the dense FFN: the difference between the two Q8_0 models
# is pure matrix work, so what is left of the wide one is the layers' own operations
# (KDA recurrence, attention, norms, activations) at this width.
KERNEL_SHAPE_NARROW = replace(KERNEL_SHAPE, n_ff_dense=2048)
# Routed experts, for the cost of llama.cpp's MUL_MAT_ID at a known number of tokens
# per expert: 8 experts of which every token uses all 8, so in a prompt of P tokens
# each expert multiplies exactly P of them.  No shared expert (its width follows
# n_ff_expert), so two models that differ only in the experts' width differ only in
# routed-expert work: 7 MoE layers x 3 matrices x 8 experts x 1024 x 2304 = 396 M weights.
MOE_KERNEL_SHAPE = replace(
    BENCH_SHAPE, n_layer=8, n_expert=8, n_expert_used=8, n_ff_expert=3072,
    n_expert_shared=0, n_vocab=4096,
)  # fmt: skip
MOE_KERNEL_SHAPE_NARROW = replace(MOE_KERNEL_SHAPE, n_ff_expert=768)
# expert types the tiers use (MXFP4 and the rest borrow, see kernels.ROUTED_SIMILAR)
# and the unquantized F16 / BF16, whose routed experts stay on the matrix-vector
# kernel (vec_dot_f16 / vec_dot_bf16) at every token count
MOE_KERNEL_TYPES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "Q3_K", "Q8_0", "F16", "BF16")
KERNEL_TYPES = (
    "Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ4_NL", "IQ2_XXS", "IQ1_S",
    "IQ1_M", "F16", "BF16", "F32",
)  # fmt: skip

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def _run(argv: Sequence[str | Path], what: str, timeout: float = 4 * 3600) -> str:
    out = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if out.returncode != 0:
        tail = (out.stdout + out.stderr)[-3000:]
        raise RuntimeError(f"{what} failed ({out.returncode}):\n{tail}")
    return out.stdout + out.stderr


def _tool(bin_dir: Path, name: str) -> Path:
    exe = bin_dir / name
    if not exe.is_file():
        raise FileNotFoundError(f"{exe} is missing: the engine build lacks llama.cpp's tools")
    return exe


def engine_build(bin_dir: Path) -> str:
    """The engine's ``--version`` line (part of the cache key)."""
    text = _run([_tool(bin_dir, "llama-bench"), "--version"], "llama-bench --version", 60)
    lines = [ln for ln in text.splitlines() if "version" in ln.lower()]
    return lines[0].strip() if lines else text.strip()[:200]


def calibration_text(words: int = 3000) -> str:
    rng = random.Random(0)
    vocab = [
        "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while",
        "experts", "route", "tokens", "through", "attention", "layers", "and", "a", "model",
        "answers", "the", "question", "about", "paris", "france", "and", "an", "image",
    ]  # fmt: skip
    return " ".join(rng.choice(vocab) for _ in range(words))


def _key(payload: dict[str, Any]) -> str:
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _type_lines(specs: Sequence[TensorSpec], type_for: Callable[[TensorSpec], str]) -> list[str]:
    """One anchored ``--tensor-type`` pattern per quantizable tensor."""
    lines = []
    for spec in specs:
        if len(spec.shape) == 1 or spec.role in ("norm", "router", "conv"):
            continue
        if spec.role in ("token_embd", "output"):
            continue  # --token-embedding-type / --output-tensor-type
        pattern = "^" + spec.name.replace(".", r"\.") + "$"
        lines.append(f"{pattern}={type_for(spec).lower()}")
    return lines


def _imatrix(bin_dir: Path, model: Path, out: Path, work: Path, threads: int) -> Path:
    text = work / "calibration.txt"
    text.write_text(calibration_text(), encoding="utf-8")
    argv: list[str | Path] = [
        _tool(bin_dir, "llama-imatrix"), "-m", model, "-f", text, "-o", out,
        "-c", "256", "--chunks", "2", "-t", str(threads),
    ]  # fmt: skip
    _run(argv, "llama-imatrix")
    return out


def _widen(pool: Path, out: Path, n_expert: int, seed: int) -> Path:
    """Copy ``pool`` with its routed experts widened to ``n_expert`` (module docstring)."""
    r = gguf.GGUFReader(pool)
    arch_field = r.fields["general.architecture"]
    arch = str(arch_field.contents())
    w = gguf.GGUFWriter(out, arch, split_max_tensors=0)
    for field in r.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value: Any = field.contents()
        if name == f"{arch}.expert_count":
            value = n_expert
        w.add_key_value(name, value, vtype, sub_type=sub)
    rng = np.random.default_rng(seed)
    makers: list[Callable[[], np.ndarray[Any, Any]]] = []
    for t in r.tensors:
        ggml_shape = [int(x) for x in t.shape]
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        if is_expert_tensor(t.name):
            p = ggml_shape[2]
            ggml_shape[2] = n_expert
            nbytes = t.n_bytes // p * n_expert
            makers.append(functools.partial(_widened_experts, t.data, p, n_expert))
        elif t.name.endswith(("ffn_gate_inp.weight", "exp_probs_b.bias")):
            ggml_shape[-1] = n_expert
            nbytes = math.prod(ggml_shape) * 4
            makers.append(functools.partial(_router, rng, tuple(reversed(ggml_shape))))
        else:
            nbytes = t.n_bytes
            makers.append(functools.partial(np.asarray, t.data))
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            dtype = np.dtype(np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16)
            w.add_tensor_info(t.name, tuple(reversed(ggml_shape)), dtype, nbytes)
        else:
            bs, ts = gguf.GGML_QUANT_SIZES[qtype]
            byte_shape = (*reversed(ggml_shape[1:]), ggml_shape[0] // bs * ts)
            w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for make in makers:
        w.write_tensor_data(make())
    w.close()
    return out


def _widened_experts(data: np.ndarray[Any, Any], p: int, n_expert: int) -> np.ndarray[Any, Any]:
    """Expert ``e`` = pool expert ``e % p`` with its rows rotated by ``e // p``
    (``data`` is experts x rows x row bytes)."""
    experts = [np.roll(data[e % p], e // p, axis=0) for e in range(n_expert)]
    return np.ascontiguousarray(np.stack(experts))


def _router(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """Fresh router weights (or a zero expert bias) for the widened expert count."""
    if len(shape) == 1:
        return np.zeros(shape, dtype=np.float32)
    return rng.normal(0.0, 1.0 / math.sqrt(shape[-1]), size=shape).astype(np.float32)


def build_model(
    model: BenchModel,
    tier: Tier | None,
    bin_dir: Path,
    cache: Path = DEFAULT_CACHE,
    *,
    threads: int | None = None,
    progress: Progress = _quiet,
) -> Path:
    """The bench model's file (built once, then taken from ``cache``); ``tier`` gives
    the types unless the model is ``pure``."""
    shape = model.shape()
    specs = list(tensor_specs(shape))
    if model.pure:
        types = {s.name: model.pure for s in specs}
    elif tier is None:
        raise ValueError(f"{model.name} needs a catalog tier for its types")
    else:
        types = {s.name: tier.type_for(s.name, s.role) for s in specs}
    key = _key({"model": asdict(model), "shape": asdict(shape), "types": types,
                "engine": engine_build(bin_dir), "pool": POOL_EXPERTS, "v": 1})  # fmt: skip
    final = cache / f"{model.name}-{key}.gguf"
    if final.is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    work = cache / f".work-{model.name}-{key}"
    work.mkdir(exist_ok=True)
    n = threads or os.cpu_count() or 1
    pool_shape = replace(
        shape, n_expert=POOL_EXPERTS, n_expert_used=min(shape.n_expert_used, POOL_EXPERTS // 2)
    )
    pool_specs = list(tensor_specs(pool_shape))
    try:
        progress(f"{model.name}: writing the F16 pool ({POOL_EXPERTS} experts per layer)")
        src = write_k3_gguf_streamed(work / "pool-F16.gguf", model.name, shape=pool_shape)
        if model.pure == "F16":  # the writer's own F16 matrices: widened as they are
            progress(f"{model.name}: widening the experts to {shape.n_expert}")
            _widen(src, work / "widened.gguf", shape.n_expert, seed=1)
            os.replace(work / "widened.gguf", final)
            return final
        argv: list[str | Path] = [_tool(bin_dir, "llama-quantize")]
        if any(t.upper() in NEEDS_IMATRIX for t in types.values()):
            progress(f"{model.name}: llama-imatrix")
            argv += ["--imatrix", _imatrix(bin_dir, src, work / "imatrix.gguf", work, n)]
        type_file = work / "tensor-types.txt"
        type_file.write_text(
            "\n".join(_type_lines(pool_specs, lambda s: types[s.name])) + "\n", encoding="utf-8"
        )
        argv += [
            "--tensor-type-file", type_file,
            "--token-embedding-type", types["token_embd.weight"].lower(),
            "--output-tensor-type", types["output.weight"].lower(),
            src, work / "pool-quantized.gguf", "Q8_0", str(n),
        ]  # fmt: skip
        progress(f"{model.name}: llama-quantize to {model.tier}'s types")
        _run(argv, "llama-quantize")
        src.unlink()
        progress(f"{model.name}: widening the experts to {shape.n_expert}")
        tmp = work / "widened.gguf"
        _widen(work / "pool-quantized.gguf", tmp, shape.n_expert, seed=1)
        os.replace(tmp, final)
    finally:
        for f in work.glob("*"):
            f.unlink()
        work.rmdir()
    return final


def build_kernel_model(
    qtype: str,
    bin_dir: Path,
    cache: Path = DEFAULT_CACHE,
    *,
    threads: int | None = None,
    progress: Progress = _quiet,
    narrow: bool = False,
    moe: bool = False,
) -> Path:
    """A dense kimi-k3 whose every matrix is ``qtype`` (``llama-quantize --pure``);
    ``narrow``: with ``KERNEL_SHAPE_NARROW``; ``moe``: the routed-expert model
    ``MOE_KERNEL_SHAPE`` (``narrow``: ``MOE_KERNEL_SHAPE_NARROW``)."""
    if moe:
        shape = MOE_KERNEL_SHAPE_NARROW if narrow else MOE_KERNEL_SHAPE
    else:
        shape = KERNEL_SHAPE_NARROW if narrow else KERNEL_SHAPE
    key = _key({"shape": asdict(shape), "type": qtype, "engine": engine_build(bin_dir), "v": 1})
    stem = ("kernel-moe" if moe else "kernel") + ("-narrow" if narrow else "")
    final = cache / f"{stem}-{qtype}-{key}.gguf"
    if final.is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    n = threads or os.cpu_count() or 1
    src = cache / f"{'kernel-moe' if moe else 'kernel'}-F16-{_key({'shape': asdict(shape)})}.gguf"
    if not src.is_file():
        progress("kernel models: writing the F16 source")
        write_k3_gguf_streamed(src.with_suffix(".tmp"), "kernel", shape=shape)
        os.replace(src.with_suffix(".tmp"), src)
    if qtype == "F16":
        return src
    argv: list[str | Path] = [_tool(bin_dir, "llama-quantize"), "--pure"]
    if qtype in NEEDS_IMATRIX:
        im = cache / f"kernel-imatrix-{_key({'shape': asdict(shape)})}.gguf"
        if not im.is_file():
            progress("kernel models: llama-imatrix")
            _imatrix(bin_dir, src, im, cache, n)
        # llama-imatrix collects nothing for the output head (and the embedding is a
        # lookup): those two stay Q8_0, as llama-quantize's own mixes keep them higher
        argv += ["--imatrix", im, "--output-tensor-type", "q8_0", "--token-embedding-type", "q8_0"]
    progress(f"kernel models: llama-quantize --pure {qtype}")
    tmp = final.with_suffix(".tmp")
    _run([*argv, src, tmp, qtype, str(n)], f"llama-quantize {qtype}")
    os.replace(tmp, final)
    return final


def main(argv: list[str] | None = None) -> int:
    names = [m.name for m in BENCH_MODELS] + [f"kernel-{t}" for t in KERNEL_TYPES]
    parser = argparse.ArgumentParser(
        prog="python -m k3desk.devtools bench-k3",
        description="Build a Kimi-K3 bench model of real size with llama.cpp's tools.",
    )
    parser.add_argument("name", choices=names)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--engine-bin", type=Path, help="folder of llama-quantize & co.")
    args = parser.parse_args(argv)
    bin_dir = args.engine_bin or _default_bin()
    if args.name.startswith("kernel-"):
        path = build_kernel_model(args.name[7:], bin_dir, args.cache, progress=_say)
    else:
        from k3desk.core.catalog.loader import load_catalog
        from k3desk.core.resources import resources_dir

        model = next(m for m in BENCH_MODELS if m.name == args.name)
        catalog = load_catalog(resources_dir() / "catalog.json")
        tier = None if model.pure else catalog.get(model.tier)
        path = build_model(model, tier, bin_dir, args.cache, progress=_say)
    print(path)
    return 0


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _default_bin() -> Path:
    from k3desk.devtools.measure import default_bin

    return default_bin()
