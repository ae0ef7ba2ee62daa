"""Write GGUF v3 headers, with tensor data left as a hole (a sparse file).

Byte-for-byte the layout ``gguf.GGUFWriter`` produces (a test compares the two):
header, metadata, tensor infos, zero padding to ``general.alignment``, then each
tensor at the next aligned offset.  Only the header is written; the file is then
extended with ``truncate`` so the data section takes no disk space.  Used for
the sparse twins of published tiers and for broken variants in tests.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from k3desk.core.gguf.ggml import BY_NAME
from k3desk.core.gguf.reader import (
    ARRAY,
    BOOL,
    DEFAULT_ALIGNMENT,
    FLOAT32,
    FLOAT64,
    INT8,
    INT16,
    INT32,
    INT64,
    STRING,
    UINT8,
    UINT16,
    UINT32,
    UINT64,
)

_FMT = {
    UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i",
    FLOAT32: "f", BOOL: "?", UINT64: "Q", INT64: "q", FLOAT64: "d",
}  # fmt: skip

MetaValue = int | float | bool | str | Sequence[int] | Sequence[float] | Sequence[str]


@dataclass(frozen=True)
class KV:
    """One metadata entry with its GGUF type (``elem_type`` for arrays)."""

    key: str
    vtype: int
    value: MetaValue
    elem_type: int = -1


@dataclass(frozen=True)
class TensorDef:
    name: str
    shape: tuple[int, ...]  # ggml order
    type_name: str

    @property
    def nbytes(self) -> int:
        t = BY_NAME[self.type_name]
        n = 1
        for d in self.shape:
            n *= d
        if self.shape[0] % t.block_size:
            raise ValueError(
                f"{self.name}: row length {self.shape[0]} is not a multiple of "
                f"{t.block_size}, the block size of {self.type_name}"
            )
        return n // t.block_size * t.type_size


def _pad(n: int, align: int) -> int:
    return -(-n // align) * align


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _strings(items: Iterable[str]) -> bytes:
    pack = struct.Struct("<Q").pack
    parts = []
    for s in items:
        b = s.encode("utf-8")
        parts.append(pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def encode_kv(kv: KV) -> bytes:
    out = [_str(kv.key), struct.pack("<I", kv.vtype)]
    if kv.vtype == STRING:
        assert isinstance(kv.value, str)
        out.append(_str(kv.value))
    elif kv.vtype == ARRAY:
        assert not isinstance(kv.value, str | int | float | bool)
        items = list(kv.value)
        out.append(struct.pack("<IQ", kv.elem_type, len(items)))
        if kv.elem_type == STRING:
            out.append(_strings(str(x) for x in items))
        else:
            out.append(struct.pack(f"<{len(items)}{_FMT[kv.elem_type]}", *items))
    else:
        out.append(struct.pack("<" + _FMT[kv.vtype], kv.value))
    return b"".join(out)


def encode_header(
    kvs: Sequence[KV | bytes], tensors: Sequence[TensorDef], alignment: int = DEFAULT_ALIGNMENT
) -> tuple[bytes, int]:
    """The header (padded to ``alignment``) and the size of the data section.

    An entry of ``kvs`` may be pre-encoded bytes (from :func:`encode_kv`), which lets
    callers reuse a large entry such as a tokenizer vocabulary across files.
    """
    out = [struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(kvs))]
    out.extend(kv if isinstance(kv, bytes) else encode_kv(kv) for kv in kvs)
    offset = 0
    for t in tensors:
        out.append(_str(t.name))
        out.append(struct.pack(f"<I{len(t.shape)}Q", len(t.shape), *t.shape))
        out.append(struct.pack("<IQ", BY_NAME[t.type_name].id, offset))
        offset = _pad(offset + t.nbytes, alignment)
    header = b"".join(out)
    header += b"\0" * (_pad(len(header), alignment) - len(header))
    return header, offset


def write_sparse_gguf(
    path: Path,
    kvs: Sequence[KV | bytes],
    tensors: Sequence[TensorDef],
    alignment: int = DEFAULT_ALIGNMENT,
    trailing: int = 0,
) -> int:
    """Write a GGUF whose tensor data is a hole; return the file's apparent size.

    ``trailing`` bytes are added after the last tensor (llama.cpp ignores them).
    """
    header, data_size = encode_header(kvs, tensors, alignment)
    size = len(header) + data_size + trailing
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(header)
        f.truncate(size)
    return size
