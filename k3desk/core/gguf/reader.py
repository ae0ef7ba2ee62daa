"""A header-only GGUF reader: metadata and tensor infos, never tensor data.

It reads the header region with a few buffered reads (64 KiB first, growing only
as far as the header goes) and decodes it with ``struct``.  Large arrays are not
decoded: numeric ones are skipped by arithmetic, and string arrays (the 163,840
tokenizer tokens and 163,328 merges of a Kimi-K3 part 1) are walked over length
prefixes without building a single Python string.  Their position is kept, so a
caller that really wants them can still decode them (:meth:`GGUFHeader.array`).

Compared to ``gguf.GGUFReader``, which memory-maps the file and builds numpy views
for every field and tensor, this is what makes checking a 94-part set take a
fraction of a second.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from k3desk.core.errors import ValidationError
from k3desk.core.gguf.ggml import BY_ID, type_name

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

# Arrays up to this many elements are decoded eagerly (head_count_kv has 93).
EAGER_ARRAY_LIMIT = 4096
_FIRST_READ = 64 * 1024
_MAX_STEP = 4 * 1024 * 1024
# Sanity limits: a header bigger than this is corrupt, whatever its counts say.
_MAX_HEADER = 1 << 30
_MAX_DIMS = 8

Scalar = int | float | bool | str


@dataclass(frozen=True)
class ArrayRef:
    """A metadata array left undecoded: its element type, length and file position."""

    elem_type: int
    count: int
    offset: int  # absolute offset of the first element

    @property
    def elem_type_name(self) -> str:
        return VALUE_TYPE_NAMES[self.elem_type]


Value = Scalar | list[Scalar] | ArrayRef


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order (ne0 first)
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

    def get(self, key: str, default: Value | None = None) -> Value | None:
        return self.kv.get(key, default)

    def array(self, key: str) -> list[Scalar]:
        """Decode an array value fully, even one left undecoded while reading."""
        v = self.kv[key]
        if isinstance(v, list):
            return v
        if not isinstance(v, ArrayRef):
            raise TypeError(f"{key} is not an array")
        with open(self.path, "rb") as f:
            f.seek(v.offset)
            r = _Buffer(f, self.path, v.offset, self.file_size)
            out, _ = r.read_array_items(v.offset, v.elem_type, v.count)
            return out

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


class _Buffer:
    """A growing window on the start of a file; ``base`` is the file offset of buf[0]."""

    def __init__(self, f: BinaryIO, path: Path, base: int, file_size: int) -> None:
        self.f = f
        self.path = path
        self.base = base
        self.file_size = file_size
        self.buf = bytearray()
        self.what = "header"

    def ensure(self, pos: int, n: int) -> None:
        """Make absolute bytes [pos, pos+n) available."""
        end = pos + n - self.base
        have = len(self.buf)
        if end <= have:
            return
        if pos + n > self.file_size:
            raise _truncated(self.path, f"reading {self.what}", self.file_size)
        if pos + n - self.base > _MAX_HEADER:
            raise _corrupt(self.path, f"{self.what} would extend past {_MAX_HEADER:,} bytes")
        # grow geometrically (capped) so long headers take few reads
        want = max(end - have, min(have, _MAX_STEP), _FIRST_READ)
        chunk = self.f.read(want)
        self.buf += chunk
        if len(self.buf) < end:
            raise _truncated(self.path, f"reading {self.what}", self.file_size)

    def scalar(self, pos: int, vtype: int) -> tuple[Scalar, int]:
        s = _SCALAR[vtype]
        self.ensure(pos, s.size)
        return s.unpack_from(self.buf, pos - self.base)[0], pos + s.size

    def u32(self, pos: int) -> tuple[int, int]:
        self.ensure(pos, 4)
        return _U32.unpack_from(self.buf, pos - self.base)[0], pos + 4

    def u64(self, pos: int) -> tuple[int, int]:
        self.ensure(pos, 8)
        return _U64.unpack_from(self.buf, pos - self.base)[0], pos + 8

    def raw_string(self, pos: int) -> tuple[bytes, int]:
        n, pos = self.u64(pos)
        if n > self.file_size:
            raise _corrupt(self.path, f"a string of {n:,} bytes at offset {pos - 8:,}")
        self.ensure(pos, n)
        start = pos - self.base
        return bytes(self.buf[start : start + n]), pos + n

    def string(self, pos: int) -> tuple[str, int]:
        raw, end = self.raw_string(pos)
        try:
            return raw.decode("utf-8"), end
        except UnicodeDecodeError:
            raise _corrupt(self.path, f"invalid UTF-8 in a string at offset {pos:,}") from None

    def skip_strings(self, pos: int, count: int) -> int:
        """Walk over ``count`` length-prefixed strings without decoding them."""
        unpack = _U64.unpack_from
        remaining = count
        while remaining:
            buf, base = self.buf, self.base
            end = base + len(buf)
            while remaining and pos + 8 <= end:
                npos = pos + 8 + unpack(buf, pos - base)[0]
                if npos > end:
                    break
                pos = npos
                remaining -= 1
            if remaining:
                need = 8
                if pos + 8 <= end:
                    n = unpack(buf, pos - base)[0]
                    if n > self.file_size:
                        raise _corrupt(self.path, f"a string of {n:,} bytes at offset {pos:,}")
                    need += n
                self.ensure(pos, need)
        return pos

    def read_array_items(self, pos: int, etype: int, count: int) -> tuple[list[Scalar], int]:
        if etype == STRING:
            out: list[Scalar] = []
            for _ in range(count):
                s, pos = self.string(pos)
                out.append(s)
            return out, pos
        if etype == ARRAY:
            raise _corrupt(self.path, "nested arrays are not supported")
        st = _SCALAR.get(etype)
        if st is None:
            raise _corrupt(self.path, f"unknown array element type {etype}")
        n = st.size * count
        self.ensure(pos, n)
        fmt = f"<{count}{_SCALAR_FMT[etype][1:]}"
        vals = list(struct.unpack_from(fmt, self.buf, pos - self.base))
        return vals, pos + n


def read_header(path: Path | str, eager_array_limit: int = EAGER_ARRAY_LIMIT) -> GGUFHeader:
    """Read the metadata and tensor infos of one GGUF file.

    Raises :class:`ValidationError` naming the file for a bad magic, an unsupported
    version, a truncated or corrupt header.
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
        size = _file_size(f)
        r = _Buffer(f, p, 0, size)
        if size < 4:
            raise ValidationError(
                f"{p.name} is not a GGUF file: it has only {size} bytes.",
                f"Delete {p} and download it again.",
            )
        r.ensure(0, min(_HEADER.size, size))
        magic = bytes(r.buf[:4])
        if magic != GGUF_MAGIC:
            raise ValidationError(
                f"{p.name} is not a GGUF file: it starts with {magic!r}, not b'GGUF'.",
                f"Delete {p} and download it again (a partial or error-page download "
                "looks like this).",
            )
        r.what = "the header"
        r.ensure(0, _HEADER.size)
        _, version, n_tensors, n_kv = _HEADER.unpack_from(r.buf, 0)
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
        if n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise _corrupt(p, f"it claims {n_tensors:,} tensors and {n_kv:,} metadata keys")
        pos = _HEADER.size
        kv: dict[str, Value] = {}
        kv_types: dict[str, int] = {}
        for i in range(n_kv):
            r.what = f"metadata entry {i + 1} of {n_kv}"
            key, pos = r.string(pos)
            vtype, pos = r.u32(pos)
            r.what = f"metadata value of '{key}'"
            value: Value
            if vtype == STRING:
                value, pos = r.string(pos)
            elif vtype == ARRAY:
                etype, pos = r.u32(pos)
                count, pos = r.u64(pos)
                if etype > FLOAT64:
                    raise _corrupt(p, f"'{key}' has unknown array element type {etype}")
                if count <= eager_array_limit:
                    value, pos = r.read_array_items(pos, etype, count)
                else:
                    value = ArrayRef(etype, count, pos)
                    if etype == STRING:
                        pos = r.skip_strings(pos, count)
                    elif etype == ARRAY:
                        raise _corrupt(p, f"'{key}' is a nested array")
                    else:
                        pos += _SCALAR[etype].size * count
                        if pos > size:
                            raise _truncated(p, f"reading '{key}'", size)
            elif vtype in _SCALAR:
                value, pos = r.scalar(pos, vtype)
            else:
                raise _corrupt(p, f"'{key}' has unknown value type {vtype}")
            kv[key] = value
            kv_types[key] = vtype

        alignment = kv.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise _corrupt(p, f"general.alignment is {alignment!r}, not a power of two")

        raw_infos: list[tuple[str, tuple[int, ...], int, int]] = []
        for i in range(n_tensors):
            r.what = f"tensor info {i + 1} of {n_tensors}"
            name, pos = r.string(pos)
            n_dims, pos = r.u32(pos)
            if n_dims == 0 or n_dims > _MAX_DIMS:
                raise _corrupt(p, f"tensor '{name}' has {n_dims} dimensions")
            r.ensure(pos, 8 * n_dims + 12)
            dims = struct.unpack_from(f"<{n_dims}Q", r.buf, pos)
            pos += 8 * n_dims
            gtype, pos = r.u32(pos)
            rel, pos = r.u64(pos)
            raw_infos.append((name, tuple(dims), gtype, rel))
        header_bytes = pos
        data_start = -(-pos // alignment) * alignment

    tensors = []
    for name, dims, gtype, rel in raw_infos:
        n = 1
        for d in dims:
            n *= d
        t = BY_ID.get(gtype)
        nbytes = n // t.block_size * t.type_size if t is not None else -1
        tensors.append(TensorInfo(name, dims, gtype, rel, data_start + rel, nbytes))
    return GGUFHeader(
        path=p,
        version=version,
        kv=kv,
        kv_types=kv_types,
        tensors=tensors,
        alignment=alignment,
        data_start=data_start,
        header_bytes=header_bytes,
        file_size=size,
    )


def _file_size(f: BinaryIO) -> int:
    return os.fstat(f.fileno()).st_size
