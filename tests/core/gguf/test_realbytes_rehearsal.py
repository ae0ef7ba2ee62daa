"""Real-bytes rehearsals (k3desk.devtools.realbytes): a tier's shapes and types, cut
short, with every byte of data on the disk and activations that stay finite."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from k3desk.core.catalog.loader import Catalog
from k3desk.core.gguf.reader import read_header
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.hardware.disk_rate import data_extents
from k3desk.core.k3arch import REDUCED_K3
from k3desk.devtools.realbytes import (
    ROUTER_STD,
    layers_for,
    pattern_block,
    shape_for,
    tensors_for,
    write_real_bytes,
)

TIER = "vcruz305-ud-iq1s"


def _write(twin_catalog: Catalog, tmp_path: Path) -> tuple[Path, list[tuple[str, int]]]:
    tier = twin_catalog.get(TIER)
    # the tier's types on the reduced shape: the real one is 3.3 GiB a layer
    path = write_real_bytes(tier, tmp_path, 3, shape=replace(REDUCED_K3, n_layer=3))
    return path, [(t.name, t.type_name) for t in read_header(path).tensors]


def test_every_byte_is_data_and_the_tier_types_are_kept(
    twin_catalog: Catalog, tmp_path: Path
) -> None:
    path, tensors = _write(twin_catalog, tmp_path)
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        extents = data_extents(fd, size)
    finally:
        os.close(fd)
    assert sum(e - s for s, e in extents) == size  # no holes: the disk must be read
    assert path.stat().st_blocks * 512 >= size
    layout = validate_shard_set(path)
    assert len(layout.layers) == 3
    tier = twin_catalog.get(TIER)
    types = {t.name: t.type_name for t in tensors_for(tier, replace(REDUCED_K3, n_layer=3))}
    assert types["blk.1.ffn_up_exps.weight"] == tier.tensor_types["experts"]
    assert dict(tensors) == types


def test_scales_are_small_routers_vary_and_biases_are_zero(
    twin_catalog: Catalog, tmp_path: Path
) -> None:
    """The pattern's F16 values (every quantized block's scale) stay below 2^-7 and
    the F32 tensors are written apart: no NaN, and a router whose top-16 differs from
    token to token (a NaN or saturated router sends every token to the same experts)."""
    f16 = np.frombuffer(pattern_block(0, 1 << 20), dtype="<f2")
    assert np.isfinite(f16).all()
    assert np.abs(f16).max() < 2**-7
    path, _ = _write(twin_catalog, tmp_path)
    header = read_header(path)
    data = path.read_bytes()
    by_name = {t.name: t for t in header.tensors}

    def f32(name: str) -> np.ndarray[tuple[int], np.dtype[np.float32]]:
        t = by_name[name]
        start = t.offset
        return np.frombuffer(data[start : start + t.nbytes], dtype="<f4")

    router = f32("blk.1.ffn_gate_inp.weight")
    assert np.isfinite(router).all()
    assert 0.5 * ROUTER_STD < router.std() < 2 * ROUTER_STD
    assert not f32("blk.1.exp_probs_b.bias").any()
    norm = f32("blk.1.ffn_norm.weight")
    assert ((norm >= 0.5) & (norm < 1.0)).all()
    # two different inputs pick different experts
    w = router.reshape(REDUCED_K3.n_expert, REDUCED_K3.n_embd)
    rng = np.random.default_rng(1)
    picks = [set(np.argsort(w @ rng.normal(size=REDUCED_K3.n_embd))[-8:]) for _ in range(2)]
    assert picks[0] != picks[1]


def test_the_rehearsal_is_sized_by_layers(twin_catalog: Catalog) -> None:
    tier = twin_catalog.get(TIER)
    n = layers_for(tier, 40 * 10**9)
    assert shape_for(tier, n).n_layer == n
    assert 10 <= n <= 12  # a UD-IQ1_S layer is about 3.3 GiB
