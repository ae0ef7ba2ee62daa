"""A vocabulary found free of duplicate tokens is not compared again: the verdict is
kept by the digest of its bytes, so a vocabulary changed in any byte is compared
again, and a damaged or unwritable record costs only time, never a verdict."""

from __future__ import annotations

import json
import stat
import struct
from pathlib import Path

import pytest

from k3desk.core.errors import ValidationError
from k3desk.core.gguf import vocabcache
from k3desk.core.gguf.reader import STRING, GGUFHeader, read_header
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.gguf.vocabcache import CheckedVocabularies
from k3desk.devtools.tinyk3 import TinyModel
from tests.oracle import gguf_edit as ge

TOKENS = "tokenizer.ggml.tokens"


def _tokens(model: TinyModel) -> list[bytes]:
    """The tokens of the one-file tiny model, as the bytes its file holds."""
    (src,) = model.parts
    h = read_header(src)
    buf, out, p = h.array_bytes(TOKENS), [], 0
    for _ in range(h.array_len(TOKENS) or 0):
        (n,) = struct.unpack_from("<Q", buf, p)
        out.append(buf[p + 8 : p + 8 + n])
        p += 8 + n
    return out


def _with_tokens(model: TinyModel, folder: Path, change: dict[int, bytes]) -> Path:
    """The one-file tiny model in ``folder`` with tokens replaced, every other byte of
    the vocabulary as it was."""
    (src,) = model.parts
    words = _tokens(model)
    for i, w in change.items():
        words[i] = w
    g = ge.load(src).set(ge.KV.of(TOKENS, ge.ARRAY, words, STRING))
    return ge.save(g, folder / src.name)


class _Counting:
    """Counts the token comparisons (GGUFHeader.first_duplicate) made while validating."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = GGUFHeader.first_duplicate

        def counted(h: GGUFHeader, key: str, buf: bytes | None = None) -> object:
            self.calls += 1
            return real(h, key, buf)

        monkeypatch.setattr(GGUFHeader, "first_duplicate", counted)


def test_a_vocabulary_is_compared_once_then_known_by_its_bytes(
    tiny_k3_single: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckedVocabularies(tmp_path / "cache")
    counting = _Counting(monkeypatch)
    (first,) = tiny_k3_single.parts
    validate_shard_set(first, checked=store)
    validate_shard_set(first, checked=store)
    assert counting.calls == 1
    record = tmp_path / "cache" / vocabcache.FILE
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert len(json.loads(record.read_text())["vocabularies"]) == 1
    # another file with the same vocabulary (another tier) is not compared either
    other = _with_tokens(tiny_k3_single, tmp_path / "same", {})
    validate_shard_set(other, checked=store)
    assert counting.calls == 1
    # without a record, every validation compares
    validate_shard_set(first, checked=None)
    assert counting.calls == 2


def test_a_vocabulary_changed_near_its_end_is_compared_again(
    tiny_k3_single: TinyModel, tmp_path: Path
) -> None:
    """The digest covers every byte: a duplicate near the end of a vocabulary otherwise
    the same as a checked one, byte for byte and in size, is still found."""
    store = CheckedVocabularies(tmp_path / "cache")
    (first,) = tiny_k3_single.parts
    validate_shard_set(first, checked=store)
    words = _tokens(tiny_k3_single)
    # the last token that has the length of an earlier one becomes a copy of it: the
    # array keeps its size and every byte before that token
    k = max(k for k, w in enumerate(words) if any(len(v) == len(w) for v in words[:k]))
    j = next(i for i in range(k) if len(words[i]) == len(words[k]))
    dup = _with_tokens(tiny_k3_single, tmp_path / "dup", {k: words[j]})
    orig, changed = (read_header(p).array_bytes(TOKENS) for p in (first, dup))
    at = sum(8 + len(w) for w in words[:k]) + 8  # where token k's bytes start
    assert at > len(orig) * 3 // 4
    assert len(changed) == len(orig)
    assert changed[:at] == orig[:at]
    with pytest.raises(ValidationError) as err:
        validate_shard_set(dup, checked=store)
    assert f"tokens {j:,} and {k:,} of tokenizer.ggml.tokens are both" in err.value.message


@pytest.mark.parametrize(
    "damage",
    [
        "not json",
        '{"schema": 1, "vocabularies": ["' + "a" * 64 + '", 7]}',
        '{"schema": 99, "vocabularies": []}',
        '{"schema": 1, "vocabularies": ["' + "../" * 30 + '"]}',
    ],
)
def test_a_damaged_record_counts_as_absent(
    tiny_k3_single: TinyModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / vocabcache.FILE).write_text(damage)
    store = CheckedVocabularies(folder)
    counting = _Counting(monkeypatch)
    (first,) = tiny_k3_single.parts
    validate_shard_set(first, checked=store)
    assert counting.calls == 1
    assert "damaged" in store.note
    assert list(folder.glob(vocabcache.FILE + ".damaged-*"))
    validate_shard_set(first, checked=store)  # the new record holds it
    assert counting.calls == 1


def test_a_record_that_cannot_be_written_costs_only_time(
    tiny_k3_single: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_the_way = tmp_path / "cache"
    in_the_way.write_text("a file where the cache folder goes")
    store = CheckedVocabularies(in_the_way)
    counting = _Counting(monkeypatch)
    (first,) = tiny_k3_single.parts
    for _ in range(2):
        assert validate_shard_set(first, checked=store).tensor_count > 0
    assert counting.calls == 2
    assert in_the_way.read_text() == "a file where the cache folder goes"


def test_the_record_keeps_the_last_32_vocabularies(tmp_path: Path) -> None:
    store = CheckedVocabularies(tmp_path)
    keys = [vocabcache.digest(b"%d" % i) for i in range(40)]
    for k in keys:
        store.add(k)
    kept = json.loads((tmp_path / vocabcache.FILE).read_text())["vocabularies"]
    assert kept == keys[-vocabcache.MAX_ENTRIES :]
    assert vocabcache.MAX_ENTRIES == 32
    assert not store.known(keys[0])
    assert store.known(keys[-1])
