"""The header-only reader agrees with the gguf package, reads only headers, and
reports bad files by name."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from k3desk.core.errors import ValidationError
from k3desk.core.gguf.ggml import BY_ID, BY_NAME
from k3desk.core.gguf.reader import (
    ARRAY,
    BOOL,
    FLOAT32,
    INT32,
    STRING,
    UINT16,
    UINT32,
    ArrayRef,
    read_header,
)
from k3desk.core.gguf.writer import KV, TensorDef, encode_header, write_sparse_gguf
from tests.fixtures.twins import TwinFactory


def test_ggml_type_table_matches_gguf_package() -> None:
    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():
        assert BY_ID[int(qt)].name == qt.name
        assert (BY_ID[int(qt)].block_size, BY_ID[int(qt)].type_size) == (block, size)
    # the engine (b11434) has one type the gguf package on PyPI does not know yet;
    # tests/oracle compares the whole table with the engine's own gguf-py
    extra = {i: (t.name, t.block_size, t.type_size) for i, t in BY_ID.items()
             if i not in {int(q) for q in gguf.GGML_QUANT_SIZES}}  # fmt: skip
    assert extra == {42: ("Q2_0", 64, 18)}


def _fields(reader: gguf.GGUFReader) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        out[name] = f.contents()
    return out


@pytest.fixture(scope="module")
def reference_reader(twin_factory: TwinFactory) -> Any:
    """gguf.GGUFReader per part of the 94-part twin (slow: part 1 takes seconds)."""
    cache: dict[int, gguf.GGUFReader] = {}

    def get(part: int) -> gguf.GGUFReader:
        if part not in cache:
            cache[part] = gguf.GGUFReader(twin_factory("grearl-iq1s")[part])
        return cache[part]

    return get


@pytest.mark.parametrize("part", [0, 1, 93])
def test_agrees_with_gguf_reader_on_a_twin(
    twin_factory: TwinFactory, reference_reader: Any, part: int
) -> None:
    path = twin_factory("grearl-iq1s")[part]
    ours = read_header(path)
    theirs = reference_reader(part)
    expected = _fields(theirs)
    assert set(ours.kv) == set(expected)
    for key, value in ours.kv.items():
        if isinstance(value, ArrayRef):
            assert value.count == len(expected[key]), key
        elif isinstance(value, float):
            assert value == pytest.approx(expected[key]), key
        else:
            assert value == expected[key], key
    assert ours.data_start == theirs.data_offset
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, t in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.shape == tuple(int(x) for x in t.shape)
        assert mine.ggml_type == int(t.tensor_type)
        assert mine.offset == t.data_offset
        assert mine.nbytes == t.n_bytes


def test_tokenizer_arrays_are_skipped_not_decoded(
    twin_factory: TwinFactory, reference_reader: Any
) -> None:
    path = twin_factory("grearl-iq1s")[0]
    h = read_header(path)
    tokens = h.kv["tokenizer.ggml.tokens"]
    assert isinstance(tokens, ArrayRef)
    assert tokens.count == 163_840
    assert h.array_len("tokenizer.ggml.merges") == 163_328
    # small arrays are decoded at once
    assert h.kv["kimi-k3.attention.head_count_kv"] == [
        1 if (i + 1) % 4 == 0 or i == 92 else 0 for i in range(93)
    ]
    # and the big ones can still be decoded on request
    decoded = h.array("tokenizer.ggml.tokens")
    theirs = reference_reader(0).fields["tokenizer.ggml.tokens"].contents()
    assert decoded[:300] == theirs[:300]
    assert decoded[-5:] == theirs[-5:]
    assert len(decoded) == 163_840


def test_reads_only_the_header_region(
    twin_factory: TwinFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = twin_factory("grearl-iq1s")[0]
    read_total = 0
    real_open = Path.open

    class Counting:
        def __init__(self, f: Any) -> None:
            self.f = f

        def read(self, n: int = -1) -> bytes:
            nonlocal read_total
            data: bytes = self.f.read(n)
            read_total += len(data)
            return data

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

    monkeypatch.setattr(Path, "open", lambda self, *a, **k: Counting(real_open(self, *a, **k)))
    h = read_header(path)
    assert h.file_size > 4 * 1024**3  # a multi-gigabyte part ...
    assert h.data_start < read_total <= h.data_start + 4 * 1024**2  # ... read up to its header


def test_header_bytes_match_gguf_writer(tmp_path: Path) -> None:
    tensors = [
        TensorDef("a.weight", (256, 4), "IQ1_S"),
        TensorDef("b.weight", (7,), "F32"),
        TensorDef("c.weight", (32, 3, 2), "Q8_0"),
    ]
    w = gguf.GGUFWriter(tmp_path / "ref.gguf", "kimi-k3")
    w.add_uint32("kimi-k3.block_count", 3)
    w.add_array("kimi-k3.attention.head_count_kv", [0, 0, 1])
    w.add_float32("x.f", 1.5)
    w.add_bool("x.b", True)
    w.add_string("x.s", "héllo")
    w.add_token_list(["a", "bb", "ccc"])
    w.add_uint16("split.no", 0)
    for t in tensors:
        w.add_tensor_info(
            t.name,
            tuple(reversed(t.shape)),
            np.dtype(np.float32),
            t.nbytes,
            raw_dtype=gguf.GGMLQuantizationType(BY_NAME[t.type_name].id),
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    kvs = [
        KV("general.architecture", STRING, "kimi-k3"),
        KV("kimi-k3.block_count", UINT32, 3),
        KV("kimi-k3.attention.head_count_kv", ARRAY, [0, 0, 1], INT32),
        KV("x.f", FLOAT32, 1.5),
        KV("x.b", BOOL, True),
        KV("x.s", STRING, "héllo"),
        KV("tokenizer.ggml.tokens", ARRAY, ["a", "bb", "ccc"], STRING),
        KV("split.no", UINT16, 0),
    ]
    ours, data_size = encode_header(kvs, tensors)
    theirs = (tmp_path / "ref.gguf").read_bytes()
    assert ours[: len(theirs)] == theirs
    assert len(ours) % 32 == 0
    assert set(ours[len(theirs) :]) <= {0}
    # 4 IQ1_S blocks of 50 B = 200 -> 224; 7 F32 = 28 -> 32; 6 Q8_0 blocks of 34 B = 204 -> 224
    assert data_size == 224 + 32 + 224
    write_sparse_gguf(tmp_path / "mine.gguf", kvs, tensors)
    back = read_header(tmp_path / "mine.gguf")
    assert [t.offset - back.data_start for t in back.tensors] == [0, 224, 256]


def _valid_bytes(tmp_path: Path) -> bytes:
    write_sparse_gguf(
        tmp_path / "ok.gguf",
        [KV("general.architecture", STRING, "kimi-k3")],
        [TensorDef("t.weight", (32,), "F32")],
    )
    return (tmp_path / "ok.gguf").read_bytes()


def test_not_a_gguf_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "model-00002-of-00003.gguf"
    bad.write_text("hello, I am an HTML error page", encoding="utf-8")
    with pytest.raises(ValidationError) as err:
        read_header(bad)
    assert "model-00002-of-00003.gguf is not a GGUF file" in err.value.message
    assert "b'hell'" in err.value.message
    assert "download it again" in err.value.hint


def test_unsupported_version(tmp_path: Path) -> None:
    data = bytearray(_valid_bytes(tmp_path))
    struct.pack_into("<I", data, 4, 1)
    (tmp_path / "v1.gguf").write_bytes(bytes(data))
    with pytest.raises(ValidationError, match=r"v1\.gguf cannot be read: it is GGUF version 1"):
        read_header(tmp_path / "v1.gguf")
    struct.pack_into(">I", data, 4, 3)
    (tmp_path / "be.gguf").write_bytes(bytes(data))
    with pytest.raises(ValidationError, match="big-endian"):
        read_header(tmp_path / "be.gguf")


@pytest.mark.parametrize("keep", [3, 20, 40, 70])
def test_truncated_header(tmp_path: Path, keep: int) -> None:
    data = _valid_bytes(tmp_path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:keep])
    with pytest.raises(ValidationError) as err:
        read_header(cut)
    assert "cut.gguf" in err.value.message
    assert "truncated" in err.value.message or "only 3 bytes" in err.value.message


def test_corrupt_string_length(tmp_path: Path) -> None:
    data = bytearray(_valid_bytes(tmp_path))
    struct.pack_into("<Q", data, 24, 1 << 50)  # length of the first key
    (tmp_path / "c.gguf").write_bytes(bytes(data))
    with pytest.raises(ValidationError, match=r"c\.gguf has a corrupt GGUF header"):
        read_header(tmp_path / "c.gguf")


def test_string_arrays_of_any_lengths_are_skipped_exactly(tmp_path: Path) -> None:
    """Runs of short strings are matched in blocks, longer ones walked: the key after
    the array must be read where it is, whatever the mix."""
    import random

    rng = random.Random(3)
    lengths = [rng.choice([0, 1, 5, 31, 32, 200, 255, 256, 300, 70_000]) for _ in range(9_000)]
    lengths += [3] * 600  # a long run of short ones at the end
    words = ["x" * n for n in lengths]
    kvs = [
        KV("tokenizer.ggml.tokens", ARRAY, words, STRING),
        KV("after", UINT32, 1234),
        KV("general.architecture", STRING, "kimi-k3"),
    ]
    write_sparse_gguf(tmp_path / "mixed.gguf", kvs, [TensorDef("t.weight", (32,), "F32")])
    h = read_header(tmp_path / "mixed.gguf", eager_array_limit=0)
    assert h.kv["after"] == 1234
    assert h.kv["general.architecture"] == "kimi-k3"
    assert h.array("tokenizer.ggml.tokens") == words


def test_invalid_utf8_is_read_as_llama_cpp_reads_it(tmp_path: Path) -> None:
    """llama.cpp keeps GGUF strings as bytes and loads a file whatever their encoding
    (a byte-level vocabulary has tokens that are not UTF-8 on their own): a stray
    byte in a name, a token, a key or a template is shown as U+FFFD, never refused."""
    kvs = [
        KV("general.architecture", STRING, "kimi-k3"),
        KV("general.name", STRING, "Tiny-K3 @@"),
        KV("tokenizer.ggml.tokens", ARRAY, ["a", "@@", "b"], STRING),
        KV("custom.@@", UINT32, 1),
        KV("custom.@!", UINT32, 2),  # distinct bytes: not a duplicate key
        KV("after", UINT32, 7),
    ]
    write_sparse_gguf(tmp_path / "ok.gguf", kvs, [TensorDef("t.weight", (32,), "F32")])
    data = (tmp_path / "ok.gguf").read_bytes()
    data = data.replace(b"@@", b"\xff\xfe").replace(b"@!", b"\xff\xfd")
    bad = tmp_path / "bytes.gguf"
    bad.write_bytes(data)
    h = read_header(bad)
    assert h.kv["general.name"] == "Tiny-K3 \ufffd\ufffd"
    assert h.array("tokenizer.ggml.tokens") == ["a", "\ufffd\ufffd", "b"]
    assert h.kv["after"] == 7
    assert h.kv["custom.\ufffd\ufffd"] in (1, 2)
    # the same key twice, byte for byte, is still corrupt (gguf.cpp refuses it)
    twice = tmp_path / "twice.gguf"
    twice.write_bytes(data.replace(b"custom.\xff\xfd", b"custom.\xff\xfe"))
    with pytest.raises(ValidationError, match="appears twice"):
        read_header(twice)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, None),
        ({900: "tok5"}, (5, 900)),
        ({255: "tok256"}, (255, 256)),  # across the blocks the fast path reads
        ({700: "y" * 300, 701: "y" * 300}, (700, 701)),  # over 255 bytes
        ({10: "a\0\0\0\0\0\0\0b", 11: "a\0\0\0\0\0\0\0b"}, (10, 11)),  # NULs inside
        ({3: "", 100: ""}, None),  # llama.cpp names an empty token [EMPTY_<id>]
        ({3: "", 4: "[EMPTY_3]"}, (3, 4)),
        ({2999: "tok2998"}, (2998, 2999)),  # in the tail after the last full block
    ],
)
def test_duplicate_tokens_are_found_by_their_bytes(
    tmp_path: Path, change: dict[int, str], expected: tuple[int, int] | None
) -> None:
    words = [f"tok{i}" for i in range(3000)]
    for i, w in change.items():
        words[i] = w
    kvs = [KV("tokenizer.ggml.tokens", ARRAY, words, STRING)]
    write_sparse_gguf(tmp_path / "v.gguf", kvs, [TensorDef("t.weight", (32,), "F32")])
    found = read_header(tmp_path / "v.gguf", eager_array_limit=0).first_duplicate(
        "tokenizer.ggml.tokens"
    )
    assert (found[:2] if found else None) == expected


@pytest.mark.parametrize("n_dims", [5, 8, 16])
def test_a_tensor_of_more_than_four_dimensions_is_refused_by_name(
    tmp_path: Path, n_dims: int
) -> None:
    """gguf_init_from_reader (ggml/src/gguf.cpp) refuses a tensor whose n_dims is above
    GGML_MAX_DIMS (4): so does the reader, with a message, whatever the count claimed."""
    kvs = [KV("general.architecture", STRING, "kimi-k3")]
    four = tmp_path / "four.gguf"
    write_sparse_gguf(four, kvs, [TensorDef("t.weight", (32, 1, 1, 2), "F32")])
    assert read_header(four).tensors[0].shape == (32, 1, 1, 2)
    many = tmp_path / "many.gguf"
    write_sparse_gguf(many, kvs, [TensorDef("t.weight", (32,) + (1,) * (n_dims - 1), "F32")])
    with pytest.raises(ValidationError) as err:
        read_header(many)
    assert err.value.message == (
        f"many.gguf has a corrupt GGUF header: tensor 't.weight' has {n_dims} dimensions "
        "(ggml has 4)."
    )


def test_a_string_array_known_by_its_bytes_is_not_walked_and_any_other_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A string array whose bytes hash to a span walked before ends where that one did
    (the bytes decide where a walk ends); the same count with other bytes is walked."""
    import hashlib

    from k3desk.core.gguf import reader

    words = [f"w{i}" * (1 + i % 7) for i in range(5000)]
    kvs = [KV("tokenizer.ggml.tokens", ARRAY, words, STRING), KV("after", UINT32, 1234)]
    write_sparse_gguf(tmp_path / "a.gguf", kvs, [TensorDef("t.weight", (32,), "F32")])
    walked = read_header(tmp_path / "a.gguf")
    span = walked.array_bytes("tokenizer.ggml.tokens")
    sha = hashlib.sha256(span).hexdigest()

    class Known:
        def __init__(self, *spans: tuple[int, str]) -> None:
            self.given = list(spans)

        def spans(self, count: int) -> list[tuple[int, str]]:
            return self.given if count == 5000 else []

    real_walk = reader._Window.skip_strings
    walks: list[int] = []

    def walk(w: reader._Window, pos: int, count: int) -> int:
        walks.append(count)
        return real_walk(w, pos, count)

    monkeypatch.setattr(reader._Window, "skip_strings", walk)
    h = read_header(tmp_path / "a.gguf", known=Known((len(span), sha)))
    assert walks == []
    assert h.kv["after"] == 1234
    assert h.array_digests == {"tokenizer.ggml.tokens": sha}
    assert h.array("tokenizer.ggml.tokens") == words
    # the same count, another byte: walked; a span the file cannot hold: walked
    words[4999] = "x" * len(words[4999])
    kvs[0] = KV("tokenizer.ggml.tokens", ARRAY, words, STRING)
    write_sparse_gguf(tmp_path / "b.gguf", kvs, [TensorDef("t.weight", (32,), "F32")])
    for path, known in (
        (tmp_path / "b.gguf", Known((len(span), sha))),
        (tmp_path / "a.gguf", Known((1 << 40, sha), (100, sha))),
    ):
        h = read_header(path, known=known)
        assert h.kv["after"] == 1234
        assert h.array_digests == {}
    assert walks == [5000, 5000]
