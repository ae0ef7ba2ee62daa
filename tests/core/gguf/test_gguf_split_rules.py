"""The split and container rules of ``k3desk validate``, each on a set broken in one way.

Each set is the tiny model rewritten with one field changed (tests/oracle/gguf_edit.py,
which parses with the ``gguf`` package, not k3desk's reader); each is one that
llama.cpp b11434 refuses (tests/oracle holds the verdicts of the engine itself).
"""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.errors import ValidationError
from k3desk.core.gguf.validate import inspect_shard_set, validate_shard_set
from k3desk.devtools.tinyk3 import TinyModel
from tests.oracle import gguf_edit as ge


def rewrite(model: TinyModel, directory: Path) -> list[tuple[Path, ge.GGUF]]:
    """The model's parts, parsed, and where a copy of each goes (same names)."""
    directory.mkdir()
    return [(directory / p.name, ge.load(p)) for p in model.parts]


def test_a_part_whose_split_number_disagrees_with_its_name_is_refused(
    tiny_k3: TinyModel, tmp_path: Path
) -> None:
    parts = rewrite(tiny_k3, tmp_path / "set")
    for i, (path, g) in enumerate(parts):
        ge.save(g.set(ge.KV.of("split.no", ge.UINT16, 2)) if i == 1 else g, path)
    with pytest.raises(ValidationError, match=r"says split\.no = 2 \(part 3\), but its name says"):
        validate_shard_set(parts[0][0])


def test_parts_holding_another_tensor_count_than_declared_are_refused(
    tiny_k3: TinyModel, tmp_path: Path
) -> None:
    parts = rewrite(tiny_k3, tmp_path / "set")
    total = sum(len(g.tensors) for _, g in parts)
    first = parts[0][1].set(ge.KV.of("split.tensors.count", ge.INT32, total + 1))
    for i, (path, g) in enumerate(parts):
        ge.save(first if i == 0 else g, path)
    with pytest.raises(
        ValidationError,
        match=rf"hold {total} tensors between them, but split\.tensors\.count says {total + 1}",
    ):
        validate_shard_set(parts[0][0])


def test_a_tensor_not_where_the_sizes_before_it_put_it_is_refused(
    tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    ((path, g),) = rewrite(tiny_k3_single, tmp_path / "one")
    data = bytearray(ge.encode(g))
    second = g.tensors[1]
    at = -(-len(g.tensors[0].data) // g.alignment) * g.alignment  # where it belongs
    info = (
        ge.encode_value(ge.STRING, second.name)
        + struct.pack(f"<I{len(second.dims)}Q", len(second.dims), *second.dims)
        + struct.pack("<IQ", second.ttype, at)
    )
    pos = data.index(info) + len(info) - 8
    data[pos : pos + 8] = struct.pack("<Q", at + g.alignment)  # one alignment further on
    path.write_bytes(bytes(data))
    with pytest.raises(
        ValidationError,
        match=rf"tensor '{second.name}' starts at data offset {at + g.alignment:,}, "
        rf"expected {at:,}",
    ):
        validate_shard_set(path)


def test_a_first_tensor_off_the_32_byte_boundary_is_refused(
    tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """general.alignment 16 is a valid GGUF, but llama.cpp maps the file and asserts that
    the tensors' buffer starts on 32 bytes; a header that ends on 16 breaks it."""
    ((path, g),) = rewrite(tiny_k3_single, tmp_path / "one")
    g = replace(g.set(ge.KV.of("general.alignment", ge.UINT32, 16)), alignment=16)
    for n in range(32):  # a comment long enough to end the header off the 32-byte grid
        trial = g.set(ge.KV.of("general.description", ge.STRING, "x" * n))
        empty = replace(trial, tensors=[replace(t, data=b"") for t in trial.tensors], extra=b"")
        if len(ge.encode(empty)) % 32:
            break
    ge.save(trial, path)
    with pytest.raises(ValidationError, match=r"not a multiple of 32: llama\.cpp maps the file"):
        validate_shard_set(path)
    # the same file with its header ending on the 32-byte grid loads
    ge.save(g.set(ge.KV.of("general.description", ge.STRING, "x" * (n + 16))), path)
    validate_shard_set(path)


@pytest.mark.parametrize("name", ["-00004-of-00003", "-00010-of-00009", "-00000-of-00003"])
def test_a_part_named_as_no_part_of_a_set_is_refused(
    tiny_k3: TinyModel, tmp_path: Path, name: str
) -> None:
    """llama.cpp loads a split set only from a part 1 named <name>-00001-of-NNNNN.gguf
    (llama_split_prefix, src/llama.cpp): a copy of part 1 under a number no part has
    is refused, even with the whole set beside it under its published names."""
    parts = rewrite(tiny_k3, tmp_path / "set")
    for path, g in parts:
        ge.save(g, path)
    odd = parts[0][0].with_name(f"{tiny_k3.name}{name}.gguf")
    ge.save(parts[0][1], odd)
    with pytest.raises(ValidationError) as err:
        validate_shard_set(odd)
    assert err.value.message.startswith(f"{odd.name} has an invalid split file name: part ")
    assert "split.count = 3" in err.value.message
    assert "pass part 1" in err.value.hint
    assert validate_shard_set(parts[0][0]).parts == tuple(p for p, _ in parts)


def test_a_whole_model_under_a_name_no_part_has_is_read_alone(
    tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """A file whose header says it is the whole model is loaded by itself, whatever its
    name (llama_model_loader reads the name only for a split.count above 1)."""
    ((_, g),) = rewrite(tiny_k3_single, tmp_path / "one")
    odd = ge.save(g, tmp_path / "one" / "Whole-00010-of-00009.gguf")
    report = inspect_shard_set(odd)
    assert report.layout.parts == (odd,)
    assert report.notes == (
        "Whole-00010-of-00009.gguf is named as part 10 of 9, which no split set has, but its "
        "header says it is the whole model: llama.cpp loads it alone.",
    )


def test_parts_with_nothing_before_their_numbers_are_refused_by_what_they_lack(
    tiny_k3: TinyModel, tmp_path: Path
) -> None:
    parts = rewrite(tiny_k3, tmp_path / "set")
    bare = [path.with_name(f"-{i + 1:05d}-of-00003.gguf") for i, (path, _) in enumerate(parts)]
    for path, (_, g) in zip(bare, parts, strict=True):
        ge.save(g, path)
    with pytest.raises(ValidationError) as err:
        validate_shard_set(bare[0])
    assert err.value.message == (
        "-00001-of-00003.gguf is part of a 3-part set (split.count = 3), but nothing comes "
        "before -NNNNN-of-NNNNN.gguf in its name: k3desk finds the other parts by that name."
    )
    assert "<name>-00001-of-000NN.gguf" in err.value.hint
