"""Real-bytes rehearsals: a published tier's layers, cut short, with data on the disk.

``python -m k3desk.devtools real-bytes TIER_ID DIR --gib 37`` writes one GGUF with
the tier's real tensor shapes and types (``twin_tensors``: its expert count,
expert width and the type of every tensor) but only as many layers as make it
about ``--gib`` GiB (or ``--layers N``), and the real headers of a twin (the keys
llama.cpp reads, the stand-in tokenizer).  Unlike a twin, whose data is a hole, every
byte of tensor data is written: llama.cpp must read it from the disk, so a model
larger than RAM streams as a real one does (page faults, read-around, the disk's
own rate), which a sparse twin cannot show.

The data is a 64 MiB random block repeated (large writes: about the disk's write
rate), with bits 5 and 6 of every second byte cleared: each little-endian F16 then has
an exponent of at most 7 (below 2^-7), so the quantized blocks' F16 scales are small
and the activations stay finite through every layer.  The F32 tensors (norms, routers,
biases, the KDA parameters: well under 1 % of the bytes) are then written apart
(:func:`write_f32`): routers small and random, expert biases zero, the rest between 0.5
and 1.  Without this, the activations overflow to NaN within a few layers, every
router's top-16 among NaN scores is the same 16 experts for every token, and nothing
streams after the first token (measured: about 13 MB read per decoded token instead
of hundreds).  With it, each token picks its own experts, spread evenly over all of
them: the page cache's worst case (a trained model's routing favours some experts).
The answers are noise.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from k3desk.core.catalog.model import Tier
from k3desk.core.gguf.writer import TensorDef, encode_header
from k3desk.core.k3arch import K3Shape, quantize_order, tensor_specs
from k3desk.core.units import GiB, MiB
from k3desk.devtools.twin import ALIGNMENT, _k3_kvs, twin_shape

BLOCK = 64 * MiB
# the routers' weights: small enough that the sigmoid gate never saturates (ties
# would route every token alike), large enough that tokens differ
ROUTER_STD = 0.02
# bits 6 and 5 of a little-endian F16's high byte are its exponent's top two bits
_ODD_MASK = 0x9F


def pattern_block(seed: int = 0, size: int = BLOCK) -> bytes:
    """``size`` random bytes (seeded), every odd byte with bits 5 and 6 cleared."""
    import random

    data = bytearray(random.Random(seed).randbytes(size))
    data[1::2] = bytes(b & _ODD_MASK for b in data[1::2])
    return bytes(data)


def shape_for(tier: Tier, layers: int) -> K3Shape:
    """The tier's shape with ``layers`` layers (the first is the dense lead)."""
    return replace(twin_shape(tier), n_layer=layers)


def tensors_for(tier: Tier, shape: K3Shape) -> list[TensorDef]:
    """Every tensor of ``shape`` with the tier's type for it, in llama-quantize's order."""
    specs = {s.name: s for s in tensor_specs(shape)}
    return [
        TensorDef(name, specs[name].shape, tier.type_for(name, specs[name].role))
        for name in quantize_order(list(specs))
    ]


def file_bytes(tier: Tier, layers: int) -> int:
    """The size of the file :func:`write_real_bytes` writes for ``layers`` layers."""
    shape = shape_for(tier, layers)
    header, data = encode_header(_k3_kvs(tier, shape, "kimi-k3"), tensors_for(tier, shape))
    return len(header) + data


def layers_for(tier: Tier, target_bytes: int) -> int:
    """The most layers (at least 2: the dense lead and one MoE layer) whose file is at
    most ``target_bytes``."""
    n = 2
    while file_bytes(tier, n + 1) <= target_bytes and n < twin_shape(tier).n_layer:
        n += 1
    return n


def write_real_bytes(
    tier: Tier, directory: str | Path, layers: int, *, seed: int = 0, shape: K3Shape | None = None
) -> Path:
    """Write the tier's first ``layers`` layers, every byte on the disk; return the file.

    ``shape`` replaces the tier's real shape (tests write small ones)."""
    s = shape or shape_for(tier, layers)
    s = replace(s, n_layer=layers)
    tensors = tensors_for(tier, s)
    header, data_size = encode_header(_k3_kvs(tier, s, "kimi-k3"), tensors, ALIGNMENT)
    path = Path(directory) / f"{tier.id}-realbytes-{layers}L.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    block = pattern_block(seed)
    with path.open("wb") as f:
        f.write(header)
        left = data_size
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
        f.flush()
        write_f32(f.fileno(), len(header), tensors, seed)
        os.fsync(f.fileno())
    return path


def tensor_offsets(tensors: list[TensorDef]) -> list[int]:
    """Each tensor's offset in the data section (``encode_header``'s layout)."""
    out, offset = [], 0
    for t in tensors:
        out.append(offset)
        offset = -(-(offset + t.nbytes) // ALIGNMENT) * ALIGNMENT
    return out


def write_f32(fd: int, data_start: int, tensors: list[TensorDef], seed: int = 0) -> int:
    """Overwrite every F32 tensor in the open file ``fd``: routers (``ffn_gate_inp``)
    normal with ``ROUTER_STD``, expert biases (``exp_probs_b``) zero, the rest uniform
    in [0.5, 1); return how many were written."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = 0
    for t, off in zip(tensors, tensor_offsets(tensors), strict=True):
        if t.type_name != "F32":
            continue
        count = t.nbytes // 4
        if t.name.endswith("ffn_gate_inp.weight"):
            values = rng.normal(0.0, ROUTER_STD, count)
        elif t.name.endswith("exp_probs_b.bias"):
            values = np.zeros(count)
        else:
            values = rng.uniform(0.5, 1.0, count)
        os.pwrite(fd, values.astype("<f4").tobytes(), data_start + off)
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3desk.devtools real-bytes",
        description="Write a tier's first layers with real data (not holes): a rehearsal "
        "of streaming a model larger than RAM.",
    )
    parser.add_argument("tier", help="tier id from the catalog (see `k3desk tiers`)")
    parser.add_argument("dir", type=Path, help="folder to write into (created if missing)")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--layers", type=int, help="number of layers (at least 2)")
    size.add_argument("--gib", type=float, help="as many layers as fit in this many GiB")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    from k3desk.core.catalog.loader import load_catalog
    from k3desk.core.errors import K3Error
    from k3desk.core.resources import resources_dir

    try:
        tier = load_catalog(resources_dir() / "catalog.json").get(args.tier)
        layers = args.layers if args.layers else layers_for(tier, int(args.gib * GiB))
        if layers < 2:
            parser.error("--layers must be at least 2 (the dense lead and one MoE layer)")
        print(f"{tier.id}: {layers} layers, {file_bytes(tier, layers) / GiB:.1f} GiB",
              file=sys.stderr)  # fmt: skip
        path = write_real_bytes(tier, args.dir, layers, seed=args.seed)
    except K3Error as exc:
        parser.exit(1, f"error: {exc}\n")
    except (OSError, ValueError) as exc:
        parser.exit(1, f"error: {exc}\n")
    print(path)
    return 0
