"""A header-only GGUF reader: metadata and tensor infos, never tensor data.

It walks the header through a small window on the file (64 KiB first, growing
to 1 MiB per read) and decodes it with ``struct``.  Large arrays are not
decoded: numeric ones are skipped by arithmetic, and string arrays (the 163,840
tokenizer tokens and 163,328 merges of a Kimi-K3 part 1) are walked over their
length prefixes without building a single Python string.  Their position is
kept, so a caller that really wants them can still decode them
(:meth:`GGUFHeader.array`).  A caller that kept what an array walked before was
(:class:`KnownSpans`: its length and SHA-256) has one whose bytes hash the same
skipped by that length, without a walk.  Compared to ``gguf.GGUFReader``, which
memory-maps the file and builds numpy views for every field and tensor, this
is what makes checking a 94-part set take a fraction of a second.

A header is hostile input: every count it states (keys, tensors, array
lengths, string lengths, dimensions) is checked against the bytes the file
really has and against the limits below *before* anything is allocated or
walked, so a corrupt or malicious file is refused in milliseconds and a few
megabytes of memory, whatever it claims.  The checks llama.cpp's own reader
makes (``gguf_init_from_reader`` in ``ggml/src/gguf.cpp`` of b11434) are made
here too, with the same outcome: empty or duplicate keys, unknown value types,
more than 4 dimensions, negative or overflowing dimensions, tensor names of 64
bytes or more, a ``general.alignment`` that is not a UINT32 power of two.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from k3desk.core.errors import ValidationError
from k3desk.core.gguf.ggml import BY_ID, type_name
from k3desk.core.units import fmt_bytes

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = (
    range(13)
)
VALUE_TYPE_NAMES = (
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING",
    "ARRAY", "UINT64", "INT64", "FLOAT64",
)  # fmt: skip
_SCALAR_FMT = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}  # fmt: skip
_SCALAR = {t: struct.Struct(f) for t, f in _SCALAR_FMT.items()}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")
_DIMS = [struct.Struct(f"<{n}Q") for n in range(5)]
_TYPE_OFFSET = struct.Struct("<IQ")

# Arrays up to this many elements are decoded eagerly (head_count_kv has 93).
EAGER_ARRAY_LIMIT = 4096
# Strings longer than this are not decoded (a StringRef stands for them).
DECODED_STRING_LIMIT = 1 << 20
_FIRST_READ = 16 * 1024
_MAX_READ = 1 << 20

# Limits on what a header may claim.  llama.cpp's own caps are far higher
# (1 GiB strings and 2^30-element arrays, gguf.cpp), which lets a small sparse
# file ask for gigabytes; these are far above anything a Kimi-K3 part holds.
MAX_KV = 65_536  # a Kimi-K3 part 1 has about 50 keys
MAX_TENSORS = 65_536  # per file; the whole Kimi-K3 has 2,573
MAX_STRING = 64 << 20  # one string; the longest real ones (chat templates) are KiB
MAX_KEY = 65_536  # one key name
MAX_STRING_ARRAY = 1 << 21  # elements of a string array; the K3 vocabulary has 163,840
MAX_ARRAY = 1 << 30  # GGUF_MAX_ARRAY_ELEMENTS (gguf.cpp)
MAX_KNOWN_SPAN = 64 << 20  # the longest string array known by its bytes (KnownSpans)
GGML_MAX_DIMS = 4  # ggml.h; gguf.cpp refuses more
GGML_MAX_NAME = 64  # ggml.h; gguf.cpp refuses tensor names of this length or more
_INT64_MAX = (1 << 63) - 1
# the smallest bytes a key/value and a tensor info can take (for counts vs. file size)
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8

Scalar = int | float | bool | str


@dataclass(frozen=True, slots=True)
class ArrayRef:
    """A metadata array left undecoded: its element type, length and file position."""

    elem_type: int
    count: int
    offset: int  # absolute offset of the first element


@dataclass(frozen=True, slots=True)
class StringRef:
    """A metadata string too long to decode: its length and file position."""

    length: int
    offset: int


Value = Scalar | list[Scalar] | ArrayRef | StringRef


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order (ne0 first), as stored (trailing 1s dropped)
    ggml_type: int
    rel_offset: int  # relative to the data section, as stored
    offset: int  # absolute offset in the file
    nbytes: int  # -1 when the type is unknown to k3desk

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def end(self) -> int:
        return self.offset + max(self.nbytes, 0)


@dataclass
class GGUFHeader:
    path: Path
    version: int
    kv: dict[str, Value]
    kv_types: dict[str, int]  # key -> GGUF value type (ARRAY for arrays)
    tensors: list[TensorInfo]
    alignment: int
    data_start: int  # absolute offset of the data section
    header_bytes: int  # bytes of header parsed (before alignment padding)
    file_size: int
    elem_types: dict[str, int] | None = None  # array key -> element type
    array_offsets: dict[str, int] | None = None  # array key -> offset of its first element
    array_ends: dict[str, int] | None = None  # array key -> offset just past its last element
    # string arrays not walked but known by their bytes (KnownSpans): key -> SHA-256 hex
    array_digests: dict[str, str] | None = None

    def get(self, key: str, default: Value | None = None) -> Value | None:
        return self.kv.get(key, default)

    def elem_type(self, key: str) -> int | None:
        """The element type of the array ``key`` (None if it is not an array)."""
        v = self.kv.get(key)
        if isinstance(v, ArrayRef):
            return v.elem_type
        return (self.elem_types or {}).get(key)

    def array(self, key: str) -> list[Scalar]:
        """Decode an array value fully, even one left undecoded while reading."""
        v = self.kv[key]
        if isinstance(v, list):
            return v
        if not isinstance(v, ArrayRef):
            raise TypeError(f"{key} is not an array")
        with self.path.open("rb") as f:
            r = _Window(f, self.path, self.file_size)
            out, _ = r.read_array_items(v.offset, v.elem_type, v.count, key)
            return out

    def array_bytes(self, key: str) -> bytes:
        """The bytes of the array ``key`` as they lie in the file (length prefixes
        included), walked and bounded while the header was read."""
        start = (self.array_offsets or {})[key]
        end = (self.array_ends or {})[key]
        with self.path.open("rb") as f:
            f.seek(start)
            buf = f.read(end - start)
        if len(buf) < end - start:
            raise _truncated(self.path, f"reading '{key}'", self.file_size)
        return buf

    def first_duplicate(self, key: str, buf: bytes | None = None) -> tuple[int, int, bytes] | None:
        """The first two elements of the string array ``key`` with the same bytes
        (what llama.cpp compares: strings that differ only in invalid UTF-8 differ),
        as (first index, second index, bytes); an empty element counts as
        ``[EMPTY_<index>]``, as llama_vocab::impl::load names it.  The array's bytes
        (walked and bounded while the header was read) are read at once and passed
        over in C where they are short: about 0.02 s for a 163,840-token
        vocabulary.  ``buf``: those bytes, when the caller has read them
        (:meth:`array_bytes`)."""
        if self.elem_type(key) != STRING:
            raise TypeError(f"{key} is not an array of strings")
        count = self.array_len(key) or 0
        if buf is None:
            buf = self.array_bytes(key)
        unpack = _U64.unpack_from
        # Blocks of _RUN strings under 256 bytes each (every token of a real
        # vocabulary) are recognised by one regular expression, in C.  When no string
        # in them holds a NUL byte (the 7 of each length prefix are all there are), the
        # runs of 7 NULs are the prefixes and nothing else: splitting on them, in C,
        # gives the strings.  Anything else is walked prefix by prefix.
        run = _short_strings()
        p = done = 0
        while count - done >= _RUN:
            m = run.match(buf, p)
            if m is None:
                break
            p = m.end()
            done += _RUN
        seen: set[bytes] = set()
        parts = buf[:p].split(_NULS) if buf.count(b"\0", 0, p) == 7 * done else []
        if done and len(parts) == done + 1:
            # [n0] [data0 n1] [data1 n2] ... [data_last]: each string but the last
            # carries the next one's length byte, cut off in C (map, itemgetter)
            seen.add(parts.pop())
            seen.update(map(_ALL_BUT_LAST, parts[1:]))
        else:
            p = done = 0
        del parts
        for _ in range(count - done):
            n = unpack(buf, p)[0]
            seen.add(buf[p + 8 : p + 8 + n])
            p += 8 + n
        if len(seen) == count and b"" not in seen:
            return None
        first: dict[bytes, int] = {}  # a duplicate: find it (rare, so a second pass)
        p = 0
        for i in range(count):
            n = unpack(buf, p)[0]
            word = buf[p + 8 : p + 8 + n] or b"[EMPTY_%d]" % i
            j = first.setdefault(word, i)
            if j != i:
                return j, i, word
            p += 8 + n
        return None

    def array_len(self, key: str) -> int | None:
        v = self.kv.get(key)
        if isinstance(v, list):
            return len(v)
        if isinstance(v, ArrayRef):
            return v.count
        return None

    @property
    def data_end(self) -> int:
        """Where the last tensor's data ends (data_start when there are none)."""
        return max((t.end for t in self.tensors), default=self.data_start)


def _truncated(path: Path, where: str, size: int) -> ValidationError:
    return ValidationError(
        f"{path.name} ends inside its GGUF header ({where}; the file has {size:,} bytes): "
        "it is truncated.",
        f"The download of {path} did not finish: delete it and download it again.",
    )


def _corrupt(path: Path, what: str) -> ValidationError:
    return ValidationError(
        f"{path.name} has a corrupt GGUF header: {what}.",
        f"Delete {path} and download it again.",
    )


def _text(b: bytes | memoryview) -> str:
    """A GGUF string as text.

    llama.cpp keeps GGUF strings as bytes (``gguf_read_emplace_helper`` reads
    them into a ``std::string`` and never checks their encoding), so invalid
    UTF-8 never makes it refuse a file: a byte-level vocabulary's tokens, a name
    or a chat template with a stray byte load and run.  k3desk reads them the
    same way; where it shows one, an invalid byte becomes U+FFFD."""
    return str(b, "utf-8", "replace")


_NULS = bytes(7)  # the high bytes of a short string's length prefix
_ALL_BUT_LAST = operator.itemgetter(slice(0, -1))
_RUN = 256  # strings per regular-expression match in skip_strings


@functools.cache
def _short_strings() -> re.Pattern[bytes]:
    """Exactly ``_RUN`` strings of under 256 bytes: a length byte, 7 zero bytes, the bytes.

    The common lengths come first, as the alternatives are tried in order."""
    lengths = [*range(1, 33), 0, *range(33, 256)]
    one = b"|".join(re.escape(bytes([n])) + b"\\x00{7}.{%d}" % n for n in lengths)
    return re.compile(b"(?s)(?:" + one + b"){%d}" % _RUN)


class _Window:
    """A window on the file: ``buf`` holds bytes [base, base + len(buf)).

    Parsing moves forward only, so the window slides: a read replaces what was
    held, and memory stays at one read (at most ``max(_MAX_READ, n)`` bytes for
    an item of n bytes; items are at most ``DECODED_STRING_LIMIT`` or a few KiB).
    """

    def __init__(self, f: BinaryIO, path: Path, file_size: int) -> None:
        self.f = f
        self.path = path
        self.file_size = file_size
        self.base = 0
        self.buf = b""
        self.step = _FIRST_READ
        self.what = "header"

    def need(self, pos: int, n: int) -> int:
        """Make bytes [pos, pos+n) available; return their offset in ``buf``."""
        rel = pos - self.base
        if rel >= 0 and rel + n <= len(self.buf):
            return rel
        if pos + n > self.file_size:
            raise _truncated(self.path, f"reading {self.what}", self.file_size)
        want = min(max(n, self.step), self.file_size - pos)
        self.step = min(self.step * 2, _MAX_READ)
        self.f.seek(pos)
        data = self.f.read(want)
        if len(data) < n:
            raise _truncated(self.path, f"reading {self.what}", self.file_size)
        self.base, self.buf = pos, data
        return 0

    def scalar(self, pos: int, vtype: int) -> tuple[Scalar, int]:
        s = _SCALAR[vtype]
        rel = self.need(pos, s.size)
        return s.unpack_from(self.buf, rel)[0], pos + s.size

    def u32(self, pos: int) -> tuple[int, int]:
        rel = self.need(pos, 4)
        return _U32.unpack_from(self.buf, rel)[0], pos + 4

    def u64(self, pos: int) -> tuple[int, int]:
        rel = self.need(pos, 8)
        return _U64.unpack_from(self.buf, rel)[0], pos + 8

    def string_length(self, pos: int, limit: int = MAX_STRING) -> tuple[int, int]:
        """The length of the string at ``pos`` (checked) and where its bytes start."""
        n, start = self.u64(pos)
        if n > limit:
            raise _corrupt(
                self.path,
                f"{self.what} claims a string of {fmt_bytes(n)} ({n:,} bytes) at offset "
                f"{pos:,}; no Kimi-K3 GGUF holds one over {fmt_bytes(limit)}",
            )
        if start + n > self.file_size:
            raise _truncated(
                self.path, f"{self.what}, a string of {n:,} bytes at offset {pos:,}", self.file_size
            )
        return n, start

    def string(self, pos: int, limit: int = MAX_STRING) -> tuple[str | StringRef, int]:
        n, start = self.string_length(pos, limit)
        if n > DECODED_STRING_LIMIT:
            return StringRef(n, start), start + n
        rel = self.need(start, n)
        return _text(self.buf[rel : rel + n]), start + n

    def raw(self, pos: int, n: int) -> bytes:
        rel = self.need(pos, n)
        return bytes(self.buf[rel : rel + n])

    def skip_strings(self, pos: int, count: int) -> int:
        """Walk over ``count`` length-prefixed strings without decoding them.

        Runs of short strings (under 256 bytes: every token and merge of a real
        vocabulary) are matched :data:`_RUN` at a time by one regular expression,
        in C; whatever it cannot match is walked prefix by prefix."""
        run = _short_strings()
        remaining = count
        while remaining:
            if remaining >= _RUN:
                rel = self.need(pos, 8)
                m = run.match(self.buf, rel)
                if m is not None:
                    pos = self.base + m.end()
                    remaining -= _RUN
                    continue
            pos = self._walk(pos, min(remaining, _RUN))
            remaining -= min(remaining, _RUN)
        return pos

    def _walk(self, pos: int, count: int) -> int:
        unpack = _U64.unpack_from
        remaining = count
        while remaining:
            rel = self.need(pos, 8)
            buf = self.buf
            p = rel
            done = remaining
            i = 0
            try:
                for i in range(remaining):  # noqa: B007 - i says where a prefix was cut
                    p += 8 + unpack(buf, p)[0]
            except struct.error:  # the next length prefix lies past the window
                done = i
            # the last string walked may jump past the window: bound it
            if p - len(buf) > MAX_STRING:
                raise _corrupt(
                    self.path,
                    f"{self.what} claims a string of over {fmt_bytes(MAX_STRING)} near offset "
                    f"{self.base + len(buf):,}",
                )
            pos = self.base + p
            if pos > self.file_size:
                raise _truncated(self.path, f"reading {self.what}", self.file_size)
            remaining -= done
        return pos

    def read_array_items(
        self, pos: int, etype: int, count: int, key: str
    ) -> tuple[list[Scalar], int]:
        if etype == STRING:
            out: list[Scalar] = []
            for _ in range(count):
                s, pos = self.string(pos, DECODED_STRING_LIMIT)
                assert isinstance(s, str)  # the limit keeps every element decoded
                out.append(s)
            return out, pos
        st = _SCALAR.get(etype)
        if st is None:
            raise _corrupt(self.path, f"'{key}' has unknown array element type {etype}")
        n = st.size * count
        rel = self.need(pos, n)
        fmt = f"<{count}{_SCALAR_FMT[etype][1:]}"
        vals = list(struct.unpack_from(fmt, self.buf, rel))
        return vals, pos + n


class KnownSpans(Protocol):
    """String arrays walked before, by what they were: a string array of ``count``
    elements whose bytes have the SHA-256 of one of :meth:`spans` is the array walked
    then, byte for byte, so it spans the same bytes and is not walked again."""

    def spans(self, count: int) -> Sequence[tuple[int, str]]:
        """(bytes, SHA-256 in hex) of the arrays of ``count`` strings walked before."""
        ...


def read_header(
    path: Path | str,
    eager_array_limit: int = EAGER_ARRAY_LIMIT,
    known: KnownSpans | None = None,
) -> GGUFHeader:
    """Read the metadata and tensor infos of one GGUF file.

    Raises :class:`ValidationError` naming the file for a bad magic, an unsupported
    version, a truncated or corrupt header, or counts the file cannot hold.  ``known``:
    string arrays walked before (see :class:`KnownSpans`); their digests are in
    ``array_digests``.
    """
    p = Path(path)
    try:
        f = p.open("rb")
    except FileNotFoundError:
        raise ValidationError(f"{p} does not exist.", "Check the path.") from None
    except IsADirectoryError:
        raise ValidationError(f"{p} is a folder, not a GGUF file.", "Pass a .gguf file.") from None
    except OSError as exc:
        raise ValidationError(f"Cannot open {p}: {exc.strerror}.") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        return _parse(f, p, size, eager_array_limit, known)


def read_header_from(
    f: BinaryIO, name: Path | str, size: int, eager_array_limit: int = EAGER_ARRAY_LIMIT
) -> GGUFHeader:
    """Read the header of a GGUF file of ``size`` bytes from ``f`` (anything with
    ``seek`` and ``read``: a remote file read by HTTP ranges, say), with the same checks
    and bounds as :func:`read_header`; ``name`` is what messages call the file."""
    return _parse(f, Path(name), size, eager_array_limit)


def _parse(
    f: BinaryIO, p: Path, size: int, eager_array_limit: int, known: KnownSpans | None = None
) -> GGUFHeader:
    r = _Window(f, p, size)
    version, n_tensors, n_kv = _read_start(r, p, size)
    meta = _read_metadata(r, p, n_kv, eager_array_limit, known)
    alignment = _alignment(p, meta.kv, meta.kv_types)
    raw_infos, pos = _read_tensor_infos(r, p, meta.end, n_tensors)
    header_bytes = pos
    data_start = -(-pos // alignment) * alignment
    if n_tensors and data_start > size:
        raise _truncated(p, "before its tensor data starts", size)

    tensors = []
    for name, dims, gtype, rel_offset in raw_infos:
        n = 1
        for d in dims:
            n *= d
        t = BY_ID.get(gtype)
        nbytes = n // t.block_size * t.type_size if t is not None else -1
        tensors.append(TensorInfo(name, dims, gtype, rel_offset, data_start + rel_offset, nbytes))
    return GGUFHeader(
        path=p,
        version=version,
        kv=meta.kv,
        kv_types=meta.kv_types,
        tensors=tensors,
        alignment=alignment,
        data_start=data_start,
        header_bytes=header_bytes,
        file_size=size,
        elem_types=meta.elem_types,
        array_offsets=meta.array_offsets,
        array_ends=meta.array_ends,
        array_digests=meta.array_digests,
    )


def _read_start(r: _Window, p: Path, size: int) -> tuple[int, int, int]:
    """(version, tensor count, key count) of the fixed header, refused when the file is
    no GGUF, a version llama.cpp does not read, or counts the file cannot hold."""
    if size < 4:
        raise ValidationError(
            f"{p.name} is not a GGUF file: it has only {size} bytes.",
            f"Delete {p} and download it again.",
        )
    rel = r.need(0, 4)
    magic = bytes(r.buf[rel : rel + 4])
    if magic != GGUF_MAGIC:
        raise ValidationError(
            f"{p.name} is not a GGUF file: it starts with {magic!r}, not b'GGUF'.",
            f"Delete {p} and download it again (a partial or error-page download looks like this).",
        )
    r.what = "the header"
    rel = r.need(0, _HEADER.size)
    _, version, n_tensors, n_kv = _HEADER.unpack_from(r.buf, rel)
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        detail = (
            "it is a big-endian file"
            if swapped in SUPPORTED_VERSIONS
            else f"it is GGUF version {version}"
        )
        raise ValidationError(
            f"{p.name} cannot be read: {detail}; k3desk and llama.cpp read little-endian "
            "GGUF versions 2 and 3.",
            "Download a current conversion of the model.",
        )
    if n_kv > MAX_KV or n_tensors > MAX_TENSORS:
        raise _corrupt(
            p,
            f"it claims {n_tensors:,} tensors and {n_kv:,} metadata keys, beyond any "
            f"Kimi-K3 file (at most {MAX_TENSORS:,} of each)",
        )
    least = _HEADER.size + n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES
    if least > size:
        raise _truncated(
            p, f"{n_tensors:,} tensors and {n_kv:,} keys need at least {least:,} bytes", size
        )
    return version, n_tensors, n_kv


@dataclass
class _Metadata:
    """The key/value section as read: values, their types, where the arrays lie."""

    kv: dict[str, Value] = field(default_factory=dict)
    kv_types: dict[str, int] = field(default_factory=dict)
    elem_types: dict[str, int] = field(default_factory=dict)
    array_offsets: dict[str, int] = field(default_factory=dict)
    array_ends: dict[str, int] = field(default_factory=dict)
    array_digests: dict[str, str] = field(default_factory=dict)
    end: int = 0  # the offset just past the section


def _read_metadata(
    r: _Window, p: Path, n_kv: int, eager_array_limit: int, known: KnownSpans | None
) -> _Metadata:
    meta = _Metadata()
    pos = _HEADER.size
    raw_keys: set[bytes] = set()  # gguf.cpp compares keys as bytes
    for i in range(n_kv):
        r.what = f"metadata entry {i + 1} of {n_kv}"
        n, start = r.string_length(pos, MAX_KEY)
        raw_key = r.raw(start, n)
        key, pos = _text(raw_key), start + n
        if not key:
            raise _corrupt(p, f"metadata entry {i + 1} has an empty key")  # gguf.cpp refuses
        if raw_key in raw_keys:
            raise _corrupt(p, f"the metadata key '{key}' appears twice")  # gguf.cpp refuses
        raw_keys.add(raw_key)
        vtype, pos = r.u32(pos)
        r.what = f"the metadata value of '{key}'"
        value: Value
        if vtype == STRING:
            value, pos = r.string(pos)
        elif vtype == ARRAY:
            etype, pos = r.u32(pos)
            count, pos = r.u64(pos)
            meta.array_offsets[key] = pos
            span = None
            if known is not None and etype == STRING and eager_array_limit < count:
                span = _known_span(r, count, pos, known)
            if span is not None:
                value, pos = ArrayRef(etype, count, pos), pos + span[0]
                meta.array_digests[key] = span[1]
            else:
                value, pos = _array(r, p, key, etype, count, pos, eager_array_limit)
            meta.array_ends[key] = pos
            meta.elem_types[key] = etype
        elif vtype in _SCALAR:
            value, pos = r.scalar(pos, vtype)
        else:
            raise _corrupt(p, f"'{key}' has unknown value type {vtype}")
        meta.kv[key] = value
        meta.kv_types[key] = vtype
    meta.end = pos
    return meta


def _alignment(p: Path, kv: dict[str, Value], kv_types: dict[str, int]) -> int:
    """general.alignment (32 when absent): a UINT32 power of two, as gguf.cpp requires."""
    alignment = kv.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in kv and kv_types["general.alignment"] != UINT32:
        raise _corrupt(
            p,
            "general.alignment is stored as "
            f"{VALUE_TYPE_NAMES[kv_types['general.alignment']]}, not UINT32",
        )
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _corrupt(p, f"general.alignment is {alignment!r}, not a power of two")
    return alignment


def _read_tensor_infos(
    r: _Window, p: Path, pos: int, n_tensors: int
) -> tuple[list[tuple[str, tuple[int, ...], int, int]], int]:
    """(name, dims, type, offset in the data) of every tensor, and the offset past them."""
    raw_infos: list[tuple[str, tuple[int, ...], int, int]] = []
    r.what = f"the tensor infos ({n_tensors:,} tensors)"
    for i in range(n_tensors):
        # name length, name, n_dims, dims, type, offset: the lengths are checked first
        rel = r.need(pos, 12)
        length = _U64.unpack_from(r.buf, rel)[0]
        if length >= GGML_MAX_NAME:
            raise _corrupt(
                p,
                f"tensor {i + 1} has a name of {length:,} bytes (ggml allows {GGML_MAX_NAME - 1})",
            )
        rel = r.need(pos, 12 + length)
        n_dims = _U32.unpack_from(r.buf, rel + 8 + length)[0]
        if n_dims > GGML_MAX_DIMS:
            name = _text(r.buf[rel + 8 : rel + 8 + length])
            raise _corrupt(
                p, f"tensor '{name}' has {n_dims:,} dimensions (ggml has {GGML_MAX_DIMS})"
            )
        info_bytes = 24 + length + 8 * n_dims
        rel = r.need(pos, info_bytes)
        buf = r.buf
        name = _text(buf[rel + 8 : rel + 8 + length])
        dims = _DIMS[n_dims].unpack_from(buf, rel + 12 + length)
        gtype, rel_offset = _TYPE_OFFSET.unpack_from(buf, rel + 12 + length + 8 * n_dims)
        pos += info_bytes
        n = 1
        for d in dims:
            if d > _INT64_MAX:
                raise _corrupt(p, f"tensor '{name}' has a negative dimension")
            n *= d
        if n > _INT64_MAX:
            raise _corrupt(p, f"tensor '{name}' has {n:,} elements, more than ggml can count")
        raw_infos.append((name, dims, gtype, rel_offset))
    return raw_infos, pos


def _known_span(r: _Window, count: int, pos: int, known: KnownSpans) -> tuple[int, str] | None:
    """(bytes, digest) of the known array of ``count`` strings whose bytes are the ones
    at ``pos``, hashed a MiB at a time; None when none is (the array is walked)."""
    if count > MAX_STRING_ARRAY:
        return None  # refused as it is walked
    for length, digest in known.spans(count):
        if not 8 * count <= length <= MAX_KNOWN_SPAN or pos + length > r.file_size:
            continue  # no array of count strings there: a damaged record
        h = hashlib.sha256()
        r.f.seek(pos)
        left = length
        while left:
            chunk = r.f.read(min(left, _MAX_READ))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
        if not left and h.hexdigest() == digest:
            return length, digest
    return None


def _array(
    r: _Window, p: Path, key: str, etype: int, count: int, pos: int, eager: int
) -> tuple[Value, int]:
    """Read (small) or skip (large) the array ``key`` of ``count`` elements at ``pos``."""
    if etype == ARRAY or (etype not in _SCALAR and etype != STRING):
        what = "nested arrays" if etype == ARRAY else f"unknown element type {etype}"
        raise _corrupt(p, f"'{key}' is an array of {what}")  # gguf.cpp refuses both
    elem = 8 if etype == STRING else _SCALAR[etype].size  # a string takes >= 8 bytes
    limit = MAX_STRING_ARRAY if etype == STRING else MAX_ARRAY
    if count > limit:
        raise _corrupt(
            p, f"'{key}' claims {count:,} elements, beyond any Kimi-K3 file (at most {limit:,})"
        )
    if pos + count * elem > r.file_size:
        raise _truncated(
            p,
            f"'{key}' has {count:,} elements, which need at least {count * elem:,} bytes",
            r.file_size,
        )
    if count <= eager:
        return r.read_array_items(pos, etype, count, key)
    if etype == STRING:
        return ArrayRef(etype, count, pos), r.skip_strings(pos, count)
    return ArrayRef(etype, count, pos), pos + elem * count
