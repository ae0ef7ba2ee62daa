"""k3desk's writers write what llama.cpp's tools write.

The tiny models (``tiny-k3``, the probe's canary) are rewritten by
``llama-quantize ... COPY``, which reads them with llama.cpp's loader and writes
them with ggml's own GGUF writer: every tensor must come back with the same
stored shape and type, every key with the same type.  The sparse twins of the
published tiers must have the structure ``llama-gguf-split`` gives a split set
and the tensor order ``llama-quantize`` gives a file; both are taken from what
the tools wrote in this run, not restated here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from k3desk.core.catalog.loader import Catalog
from k3desk.core.gguf.reader import GGUFHeader, read_header
from k3desk.core.k3arch import quantize_order
from k3desk.devtools.tinyk3 import write_tiny_k3
from tests.fixtures.twins import TwinFactory
from tests.oracle.llama import OracleSets, tool


def _tensors(h: GGUFHeader) -> dict[str, tuple[tuple[int, ...], int]]:
    return {t.name: (t.shape, t.ggml_type) for t in h.tensors}


@pytest.mark.parametrize("wide", [False, True], ids=["tiny", "tiny-wide"])
def test_llama_cpp_rewrites_the_tiny_model_unchanged(
    wide: bool, engine_bin: Path, tmp_path: Path
) -> None:
    model = write_tiny_k3(tmp_path / "ours", wide=wide)
    copy = tmp_path / "copy.gguf"
    subprocess.run(
        [tool(engine_bin, "llama-quantize"), model.first_part, copy, "COPY"],
        capture_output=True,
        check=True,
        timeout=120,
    )
    ours, theirs = read_header(model.first_part), read_header(copy)
    assert _tensors(ours) == _tensors(theirs)  # 3-D convolutions, as ggml stores them
    assert {t.shape for t in ours.tensors if "ssm_conv1d" in t.name} == {
        (4, 1, 64 if not wide else 256)
    }
    added = set(theirs.kv) - set(ours.kv)
    assert added == {"general.quantization_version"}  # what llama-quantize adds
    assert {k: ours.kv_types[k] for k in ours.kv} == {k: theirs.kv_types[k] for k in ours.kv}


def test_llama_quantize_orders_tensors_as_k3arch_says(oracle_sets: OracleSets) -> None:
    for path in oracle_sets.quantized.values():
        names = [t.name for t in read_header(path).tensors]
        assert names == quantize_order(names), path.name


def test_twins_have_the_structure_llama_gguf_split_writes(
    oracle_sets: OracleSets, twin_factory: TwinFactory, twin_catalog: Catalog
) -> None:
    real = [read_header(p) for p in oracle_sets.by_count["Q4_K_M"]]
    source = read_header(oracle_sets.quantized["Q4_K_M"])
    # what llama-gguf-split does, read off its output
    split_keys = list(real[1].kv)
    assert split_keys == list(real[2].kv)  # later parts: the split keys, nothing else
    assert list(real[0].kv) == [*source.kv, *split_keys]  # part 1: the model's, then those
    split_types = [real[1].kv_types[k] for k in split_keys]
    order = [t.name for h in real for t in h.tensors]
    assert order == [t.name for t in source.tensors]  # tensors keep the file's order

    for tier_id in ("grearl-iq1s", "6block-iq1s-xxs-832e", "atomicchat-iq1s"):
        parts = [read_header(p) for p in twin_factory(tier_id)]
        assert len(parts) == twin_catalog.get(tier_id).shard_count
        for i, h in enumerate(parts):
            if i == 0:
                assert list(h.kv)[-len(split_keys) :] == split_keys, tier_id
            else:
                assert list(h.kv) == split_keys, tier_id
            assert [h.kv_types[k] for k in split_keys] == split_types
        names = [t.name for h in parts for t in h.tensors]
        assert names == quantize_order(names), tier_id
        # every key the tools wrote has the type they wrote it with
        twin_types = parts[0].kv_types
        for key, vtype in source.kv_types.items():
            if key in twin_types and key.startswith(("kimi-k3.", "tokenizer.", "general.")):
                assert twin_types[key] == vtype, key
        conv = {t.shape for h in parts for t in h.tensors if "ssm_conv1d" in t.name}
        assert conv == {(4, 1, 96 * 128)}
