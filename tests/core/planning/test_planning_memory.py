"""KV cache, KDA state and compute buffers of Kimi-K3 as llama.cpp allocates them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.errors import PlanError
from k3desk.core.gguf.model import hparams_from_shape
from k3desk.core.k3arch import REAL_K3
from k3desk.core.planning.memory import (
    compute_buffer_bytes,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_cache_layer_bytes,
    mmproj_file_bytes,
    recurrent_state_bytes,
    recurrent_state_layer_bytes,
)
from k3desk.core.units import GiB, MiB

HP = hparams_from_shape(REAL_K3)
MLA = [i for i, kv in enumerate(HP.head_count_kv) if kv > 0]
KDA = [i for i, kv in enumerate(HP.head_count_kv) if kv == 0]


def test_k3_has_24_mla_and_69_kda_layers() -> None:
    assert len(MLA) == 24
    assert len(KDA) == 69
    assert MLA[-1] == 92  # the last layer is MLA


def test_kv_is_the_compressed_latent_of_mla_layers_only() -> None:
    # 576 f16 elements per token per MLA layer
    assert kv_bytes_per_token(HP, "f16") == 24 * 576 * 2
    for i in KDA:
        assert kv_cache_layer_bytes(HP, i, 8192) == 0
    for i in MLA:
        assert kv_cache_layer_bytes(HP, i, 8192) == 8192 * 576 * 2
    assert kv_cache_bytes(HP, 8192) == 216 * MiB


@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "q4_0", "f32"])
def test_kv_grows_linearly_with_context(kv_type: str) -> None:
    sizes = [kv_cache_bytes(HP, ctx, kv_type) for ctx in (4096, 8192, 16384, 1_048_576)]
    assert sizes[1] == 2 * sizes[0]
    assert sizes[2] == 4 * sizes[0]
    assert sizes[3] == 256 * sizes[0]


def test_quantized_kv_is_smaller_and_the_full_context_costs_27_gib() -> None:
    assert kv_cache_bytes(HP, 1_048_576, "f16") == 27 * GiB
    assert kv_cache_bytes(HP, 8192, "q8_0") == kv_cache_bytes(HP, 8192, "f16") * 34 // 64
    with pytest.raises(PlanError, match="Unknown KV cache type 'q3_x'"):
        kv_cache_bytes(HP, 8192, "q3_x")


def test_kv_per_token_follows_kv_lora_rank() -> None:
    wider = replace(HP, kv_lora_rank=1024)
    assert kv_bytes_per_token(wider) == 24 * (1024 + 64) * 2


def test_kda_state_is_fixed_per_sequence_and_mla_layers_have_none() -> None:
    per_layer = 96 * 128 * 128 * 4 + 3 * 3 * 96 * 128 * 4
    assert recurrent_state_layer_bytes(HP, KDA[0]) == per_layer
    assert recurrent_state_layer_bytes(HP, MLA[0]) == 0
    assert recurrent_state_bytes(HP) == 69 * per_layer
    assert recurrent_state_bytes(HP, parallel=4) == 4 * 69 * per_layer


def test_compute_buffer_scales_with_ubatch_and_without_flash_attention_with_context() -> None:
    base = compute_buffer_bytes(HP, 8192)
    assert compute_buffer_bytes(HP, 8192, ubatch=1024) > 1.9 * base
    assert compute_buffer_bytes(HP, 8192, with_output=True) - base == 4 * 512 * 163840
    no_fa_small = compute_buffer_bytes(HP, 8192, flash_attn=False)
    no_fa_big = compute_buffer_bytes(HP, 65536, flash_attn=False)
    assert no_fa_big - no_fa_small == 4 * 512 * (65536 - 8192) * 96
    assert compute_buffer_bytes(HP, 65536) - base == 2 * 512 * (65536 - 8192)
    # the order of magnitude llama.cpp reports for DeepSeek-class models
    assert 0.3 * GiB < base < 2 * GiB


def test_mmproj_size_and_a_missing_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "mmproj-F16.gguf"
    f.write_bytes(b"\0" * 1234)
    assert mmproj_file_bytes(f) == 1234
    missing = tmp_path / "nope.gguf"
    with pytest.raises(PlanError, match=r"projector file .*nope\.gguf does not exist"):
        mmproj_file_bytes(missing)
    with pytest.raises(PlanError, match="not a file"):
        mmproj_file_bytes(tmp_path)
