"""Part 1's long string arrays are walked, and its vocabulary compared, once: both are
kept by the digest of their bytes, so an array changed in any byte is walked and
compared again, and a damaged or unwritable record costs only time, never a verdict."""

from __future__ import annotations

import json
import stat
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.engines.canary import write_k3_gguf
from k3desk.core.errors import ValidationError
from k3desk.core.gguf import reader, vocabcache
from k3desk.core.gguf.reader import STRING, GGUFHeader, read_header
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.gguf.vocabcache import CheckedVocabularies, Walked
from k3desk.core.k3arch import TINY_K3
from tests.oracle import gguf_edit as ge

TOKENS = "tokenizer.ggml.tokens"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-file tiny Kimi-K3 whose vocabulary (6,000 tokens) is long enough to be
    walked, not decoded, by the reader (EAGER_ARRAY_LIMIT)."""
    shape = replace(TINY_K3, n_vocab=6000)
    (path,) = write_k3_gguf(tmp_path_factory.mktemp("vocab"), "Vocab-K3", shape=shape)
    assert read_header(path).array_len(TOKENS) == 6000 > reader.EAGER_ARRAY_LIMIT
    return path


def _tokens(path: Path) -> list[bytes]:
    """The tokens of ``path``, as the bytes the file holds."""
    h = read_header(path)
    buf, out, p = h.array_bytes(TOKENS), [], 0
    for _ in range(h.array_len(TOKENS) or 0):
        (n,) = struct.unpack_from("<Q", buf, p)
        out.append(buf[p + 8 : p + 8 + n])
        p += 8 + n
    return out


def _with_tokens(src: Path, folder: Path, change: dict[int, bytes]) -> Path:
    """``src`` in ``folder`` with tokens replaced, every other byte of the vocabulary
    as it was."""
    words = _tokens(src)
    for i, w in change.items():
        words[i] = w
    g = ge.load(src).set(ge.KV.of(TOKENS, ge.ARRAY, words, STRING))
    return ge.save(g, folder / src.name)


class _Counting:
    """Counts the token comparisons and the string walks made while validating."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.compared = 0
        self.walked = 0
        compare = GGUFHeader.first_duplicate
        walk = reader._Window.skip_strings

        def counted_compare(h: GGUFHeader, key: str, buf: bytes | None = None) -> object:
            self.compared += 1
            return compare(h, key, buf)

        def counted_walk(w: reader._Window, pos: int, count: int) -> int:
            self.walked += 1
            return walk(w, pos, count)

        monkeypatch.setattr(GGUFHeader, "first_duplicate", counted_compare)
        monkeypatch.setattr(reader._Window, "skip_strings", counted_walk)


def test_a_vocabulary_is_walked_and_compared_once_then_known_by_its_bytes(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckedVocabularies(tmp_path / "cache")
    other = _with_tokens(model, tmp_path, {})  # another tier with the same vocabulary
    counting = _Counting(monkeypatch)
    first = validate_shard_set(model, checked=store)
    assert (counting.compared, counting.walked) == (1, 1)
    again = validate_shard_set(model, checked=store)
    assert (counting.compared, counting.walked) == (1, 1)
    assert again == first
    record = tmp_path / "cache" / vocabcache.FILE
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    (kept,) = json.loads(record.read_text())["arrays"]
    assert kept["strings"] == 6000
    assert kept["no_duplicates"] is True
    # another file with the same vocabulary is not walked or compared either
    validate_shard_set(other, checked=store)
    assert (counting.compared, counting.walked) == (1, 1)
    # without a record, every validation walks and compares
    validate_shard_set(model, checked=None)
    assert (counting.compared, counting.walked) == (2, 2)


def test_a_vocabulary_changed_near_its_end_is_compared_again(model: Path, tmp_path: Path) -> None:
    """The digest covers every byte: a duplicate near the end of a vocabulary otherwise
    the same as a checked one, byte for byte and in size, is still found."""
    store = CheckedVocabularies(tmp_path / "cache")
    validate_shard_set(model, checked=store)
    words = _tokens(model)
    # the last token that has the length of an earlier one becomes a copy of it: the
    # array keeps its size and every byte before that token
    k = max(k for k, w in enumerate(words) if any(len(v) == len(w) for v in words[:k]))
    j = next(i for i in range(k) if len(words[i]) == len(words[k]))
    dup = _with_tokens(model, tmp_path, {k: words[j]})
    orig, changed = (read_header(p).array_bytes(TOKENS) for p in (model, dup))
    at = sum(8 + len(w) for w in words[:k]) + 8  # where token k's bytes start
    assert at > len(orig) * 3 // 4
    assert len(changed) == len(orig)
    assert changed[:at] == orig[:at]
    with pytest.raises(ValidationError) as err:
        validate_shard_set(dup, checked=store)
    assert f"tokens {j:,} and {k:,} of tokenizer.ggml.tokens are both" in err.value.message


def _entry(**change: object) -> str:
    e = {"strings": 6000, "bytes": 60_000, "sha256": "a" * 64, "no_duplicates": True}
    return json.dumps({"schema": vocabcache.SCHEMA, "arrays": [{**e, **change}]})


@pytest.mark.parametrize(
    "damage",
    [
        "not json",
        _entry(sha256="../" * 30),
        _entry(no_duplicates="yes"),
        _entry(bytes=100),  # fewer bytes than 6,000 strings take
        _entry(bytes=1 << 40),
        '{"schema": 1, "vocabularies": []}',
    ],
)
def test_a_damaged_record_counts_as_absent(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / vocabcache.FILE).write_text(damage)
    store = CheckedVocabularies(folder)
    counting = _Counting(monkeypatch)
    validate_shard_set(model, checked=store)
    assert (counting.compared, counting.walked) == (1, 1)
    assert "damaged" in store.note
    assert list(folder.glob(vocabcache.FILE + ".damaged-*"))
    validate_shard_set(model, checked=store)  # the new record holds it
    assert (counting.compared, counting.walked) == (1, 1)


def test_a_record_that_cannot_be_written_costs_only_time(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_the_way = tmp_path / "cache"
    in_the_way.write_text("a file where the cache folder goes")
    store = CheckedVocabularies(in_the_way)
    counting = _Counting(monkeypatch)
    for _ in range(2):
        assert validate_shard_set(model, checked=store).tensor_count > 0
    assert (counting.compared, counting.walked) == (2, 2)
    assert in_the_way.read_text() == "a file where the cache folder goes"


def test_the_record_keeps_the_last_32_arrays(tmp_path: Path) -> None:
    store = CheckedVocabularies(tmp_path)
    walked = [Walked(10, 80 + i, vocabcache.digest(b"%d" % i), True) for i in range(40)]
    for w in walked:
        store.add(w)
    kept = json.loads((tmp_path / vocabcache.FILE).read_text())["arrays"]
    assert [e["sha256"] for e in kept] == [w.sha256 for w in walked[-vocabcache.MAX_ENTRIES :]]
    assert vocabcache.MAX_ENTRIES == 32
    assert not store.known(walked[0].sha256)
    assert store.known(walked[-1].sha256)
    assert store.spans(10)[-1] == (80 + 39, walked[-1].sha256)
