"""The tiny Kimi-K3 writer: names, split keys, tensor list and types, vocabulary, template."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from k3desk.core.engines.canary import CONTROL_TOKENS, write_k3_gguf
from k3desk.core.k3arch import TINY_K3, tensor_specs
from k3desk.devtools.tinyk3 import TinyModel, kimi_k3_template, write_tiny_k3

REPO = Path(__file__).resolve().parents[3]


def _field(r: gguf.GGUFReader, key: str) -> object:
    return r.fields[key].contents()


def _digest(paths: list[Path]) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def test_three_shards_are_named_and_keyed_as_llama_cpp_expects(tiny_k3: TinyModel) -> None:
    names = [p.name for p in tiny_k3.parts]
    assert names == [f"Tiny-K3-IQ1_S-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    total = len(list(tensor_specs(TINY_K3)))
    counts = []
    for i, part in enumerate(tiny_k3.parts):
        r = gguf.GGUFReader(part)
        assert _field(r, "split.no") == i
        assert _field(r, "split.count") == 3
        assert _field(r, "split.tensors.count") == total
        counts.append(len(r.tensors))
    assert sum(counts) == total
    assert max(counts) - min(counts) <= 1  # balanced
    # the model's keys live in the first part only
    first = gguf.GGUFReader(tiny_k3.parts[0])
    assert _field(first, "general.architecture") == "kimi-k3"
    assert "kimi-k3.block_count" not in gguf.GGUFReader(tiny_k3.parts[1]).fields


def test_tensors_match_the_kimi_k3_layout_with_the_right_types(tiny_k3: TinyModel) -> None:
    found = {}
    for part in tiny_k3.parts:
        for t in gguf.GGUFReader(part).tensors:
            found[t.name] = (tuple(int(x) for x in t.shape), t.tensor_type)
    specs = list(tensor_specs(TINY_K3))
    assert [s.name for s in specs] == list(found)  # same tensors, same order
    f32, f16 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16
    for s in specs:
        shape, ttype = found[s.name]
        assert shape == s.shape, s.name
        want_f32 = len(s.shape) == 1 or s.role in ("norm", "router", "conv") or "attn_k_b" in s.name
        assert ttype == (f32 if want_f32 else f16), s.name
    assert found["blk.2.attn_k_b.weight"][1] == f32  # F16 trips the AMX repack assertion
    assert found["blk.1.ffn_gate_exps.weight"][1] == f16


def test_hyperparameters_vocab_and_template(tiny_k3: TinyModel) -> None:
    r = gguf.GGUFReader(tiny_k3.parts[0])
    assert list(_field(r, "kimi-k3.attention.head_count_kv")) == [0, 0, 1, 0, 0, 1]
    assert _field(r, "kimi-k3.expert_count") == 8
    assert _field(r, "kimi-k3.expert_used_count") == 2
    assert _field(r, "kimi-k3.attention.key_length") == 40
    assert _field(r, "kimi-k3.attn_res.block_size") == 2
    tokens = list(_field(r, "tokenizer.ggml.tokens"))
    assert len(tokens) == 512 == len(set(tokens))
    assert tokens[-len(CONTROL_TOKENS) :] == list(CONTROL_TOKENS)
    types = list(_field(r, "tokenizer.ggml.token_type"))
    assert set(types[-len(CONTROL_TOKENS) :]) == {int(gguf.TokenType.CONTROL)}
    assert tokens[_field(r, "tokenizer.ggml.eos_token_id")] == "<|end_of_msg|>"
    assert tokens[_field(r, "tokenizer.ggml.bos_token_id")] == "[BOS]"
    assert _field(r, "tokenizer.ggml.add_bos_token") is False
    assert _field(r, "tokenizer.ggml.pre") == "kimi-k2"
    merges = list(_field(r, "tokenizer.ggml.merges"))
    assert len(merges) >= 512 - 256 - len(CONTROL_TOKENS)
    template = _field(r, "tokenizer.chat_template")
    assert template == kimi_k3_template()
    assert "<|open|>" in str(template)
    assert "thinking" in str(template)


def test_projector_is_a_tiny_llava_mlp_sized_for_the_text_model(tiny_k3: TinyModel) -> None:
    assert tiny_k3.mmproj is not None
    assert tiny_k3.mmproj.name == "mmproj-Tiny-K3-IQ1_S-F16.gguf"
    r = gguf.GGUFReader(tiny_k3.mmproj)
    assert _field(r, "general.architecture") == "clip"
    assert _field(r, "clip.projector_type") == "mlp"
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    assert shapes["mm.2.weight"][-1] == TINY_K3.n_embd  # output width = text embedding
    assert shapes["v.position_embd.weight"] == (32, 17)  # 16 patches + class
    assert tiny_k3.mmproj.stat().st_size < 100_000


def test_files_are_small_and_deterministic(tmp_path: Path, tiny_k3: TinyModel) -> None:
    assert tiny_k3.total_bytes < 1024 * 1024
    again = write_tiny_k3(tmp_path, shards=3, mmproj=True)
    assert tiny_k3.mmproj is not None
    assert again.mmproj is not None
    assert _digest([*tiny_k3.parts, tiny_k3.mmproj]) == _digest([*again.parts, again.mmproj])
    other = write_tiny_k3(tmp_path / "seed1", shards=3, seed=1)
    assert _digest(list(other.parts)) != _digest(list(tiny_k3.parts))


def test_weights_are_finite_and_norms_are_one(tiny_k3_single: TinyModel) -> None:
    r = gguf.GGUFReader(tiny_k3_single.first_part)
    assert tiny_k3_single.first_part.name == "Tiny-K3-IQ1_S.gguf"
    for t in r.tensors:
        data = np.asarray(t.data, dtype=np.float32)
        assert np.isfinite(data).all(), t.name
        if t.name.endswith("attn_norm.weight"):
            assert (data == 1.0).all()
        if t.name.endswith(".ssm_a"):
            assert (data < 0).all()  # -exp(A_log)


def test_shard_count_is_checked(tmp_path: Path) -> None:
    n = len(list(tensor_specs(TINY_K3)))
    with pytest.raises(ValueError, match=f"between 1 and {n}"):
        write_k3_gguf(tmp_path, "x", shards=n + 1)
    with pytest.raises(ValueError, match="between 1"):
        write_tiny_k3(tmp_path, shards=0)


def test_devtool_command_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "k3desk.devtools",
            "tiny-k3",
            str(tmp_path),
            "--shards",
            "2",
            "--mmproj",
            "--name",
            "Tiny-K3-Q2_K",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    printed = [Path(x).name for x in out.stdout.split()]
    assert printed == [
        "Tiny-K3-Q2_K-00001-of-00002.gguf",
        "Tiny-K3-Q2_K-00002-of-00002.gguf",
        "mmproj-Tiny-K3-Q2_K-F16.gguf",
    ]
    assert all((tmp_path / n).is_file() for n in printed)
    bad = subprocess.run(
        [sys.executable, "-m", "k3desk.devtools", "tiny-k3", str(tmp_path), "--shards", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert "--shards must be at least 1" in bad.stderr
