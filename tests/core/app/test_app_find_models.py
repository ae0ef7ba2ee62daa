"""Finding the model in a folder: part 1 of each shard set (llama.cpp's split names), an
unsplit file, and the projector paired with the set beside it."""

from __future__ import annotations

from pathlib import Path

from k3desk.core.app.models import find_model, find_models, model_name


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def test_part_one_of_each_set_with_the_projector_beside_it(tmp_path: Path) -> None:
    a1 = touch(tmp_path / "a" / "Kimi-K3-IQ1_S-00001-of-00003.gguf")
    touch(tmp_path / "a" / "Kimi-K3-IQ1_S-00002-of-00003.gguf")
    touch(tmp_path / "a" / "Kimi-K3-IQ1_S-00003-of-00003.gguf")
    a_proj = touch(tmp_path / "a" / "mmproj-Kimi-K3-BF16.gguf")
    b = touch(tmp_path / "b" / "single.gguf")
    touch(tmp_path / "b" / "Broken-00000-of-00002.gguf")  # no part 1 llama.cpp would load
    touch(tmp_path / "b" / "notes.txt")
    found = find_models(tmp_path)
    assert [(f.shard, f.parts, f.name) for f in found] == [
        (a1, 3, "Kimi-K3-IQ1_S"),
        (b, 1, "single"),
    ]
    assert found[0].projector == a_proj
    # a set without a projector of its own gets the one found elsewhere
    assert found[1].projector == a_proj
    first = find_model(tmp_path)
    assert first is not None
    assert first.shard == a1


def test_nothing_to_find(tmp_path: Path) -> None:
    assert find_model(tmp_path / "missing") is None
    touch(tmp_path / "mmproj-only.gguf")
    assert find_model(tmp_path) is None


def test_a_set_is_named_without_its_split_suffix() -> None:
    assert model_name(Path("/m/UD-IQ1_S-00001-of-00009.gguf")) == "UD-IQ1_S"
    assert model_name(Path("/m/tiny.gguf")) == "tiny"
