"""A small GGUF editor for the mutation corpus: read a file, change it, write it.

Parsing uses the ``gguf`` package's reader, not k3desk's, so a bug in the code
under test cannot shape the variants it is judged on.  Every key keeps its raw
value bytes unless a mutation replaces them, and every tensor its raw data, so
an unmutated round trip is byte-identical (a test checks it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import gguf

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = (
    range(13)
)
FMT = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f",
       BOOL: "?", UINT64: "Q", INT64: "q", FLOAT64: "d"}  # fmt: skip


@dataclass(frozen=True)
class KV:
    key: str
    vtype: int
    raw: bytes  # the value as stored after its type field (arrays: element type, count, items)

    @staticmethod
    def of(key: str, vtype: int, value: object, elem: int = -1) -> KV:
        return KV(key, vtype, encode_value(vtype, value, elem))

    def scalar(self) -> int | float | bool:
        value: int | float | bool = struct.unpack("<" + FMT[self.vtype], self.raw)[0]
        return value

    def array(self) -> tuple[int, list[object]]:
        """(element type, items) of an array of numbers."""
        etype, n = struct.unpack_from("<IQ", self.raw)
        return etype, list(struct.unpack_from(f"<{n}{FMT[etype]}", self.raw, 12))

    def strings(self) -> list[bytes]:
        """The items of an array of strings, as bytes."""
        etype, n = struct.unpack_from("<IQ", self.raw)
        assert etype == STRING, self.key
        out, pos = [], 12
        for _ in range(n):
            (length,) = struct.unpack_from("<Q", self.raw, pos)
            out.append(self.raw[pos + 8 : pos + 8 + length])
            pos += 8 + length
        return out

    def text(self) -> bytes:
        """The bytes of a string value."""
        assert self.vtype == STRING, self.key
        return self.raw[8:]


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple[int, ...]  # ggml order, as stored
    ttype: int
    data: bytes


@dataclass
class GGUF:
    kvs: list[KV]
    tensors: list[Tensor]
    alignment: int = 32
    version: int = 3
    extra: bytes = b""  # bytes after the last tensor
    # counts written in the header instead of the real ones (hostile variants)
    n_tensors: int | None = None
    n_kv: int | None = None

    # ---------------------------------------------------------------- keys
    def kv(self, key: str) -> KV | None:
        return next((k for k in self.kvs if k.key == key), None)

    def set(self, kv: KV) -> GGUF:
        """Replace the key in place, or append it."""
        out = replace(self, kvs=list(self.kvs))
        for i, k in enumerate(out.kvs):
            if k.key == kv.key:
                out.kvs[i] = kv
                return out
        out.kvs.append(kv)
        return out

    def drop_key(self, key: str) -> GGUF:
        return replace(self, kvs=[k for k in self.kvs if k.key != key])

    # ---------------------------------------------------------------- tensors
    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def has(self, name: str) -> bool:
        return any(t.name == name for t in self.tensors)

    def drop(self, *names: str) -> GGUF:
        gone = set(names)
        return replace(self, tensors=[t for t in self.tensors if t.name not in gone])

    def put(self, t: Tensor) -> GGUF:
        """Replace the tensor of that name in place, or append it."""
        out = replace(self, tensors=list(self.tensors))
        for i, old in enumerate(out.tensors):
            if old.name == t.name:
                out.tensors[i] = t
                return out
        out.tensors.append(t)
        return out


def encode_value(vtype: int, value: object, elem: int = -1) -> bytes:
    if vtype == STRING:
        # bytes as they are; a str's lone surrogates (surrogateescape) stand for bytes
        # that are not UTF-8, so a variant can hold any string llama.cpp may meet
        b = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogateescape")
        return struct.pack("<Q", len(b)) + b
    if vtype == ARRAY:
        items = list(value)  # type: ignore[call-overload]
        out = [struct.pack("<IQ", elem, len(items))]
        if elem == STRING:
            out += [encode_value(STRING, s) for s in items]
        else:
            out.append(struct.pack(f"<{len(items)}{FMT[elem]}", *items))
        return b"".join(out)
    return struct.pack("<" + FMT[vtype], value)


def load(path: Path) -> GGUF:
    r = gguf.GGUFReader(path)
    kvs = []
    alignment = 32
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        raw = b"".join(bytes(p.tobytes()) for p in f.parts[3:])
        vtype = int(f.types[0])
        kvs.append(KV(name, vtype, raw))
        if name == "general.alignment":
            alignment = int(f.parts[-1][0])
    tensors = [
        Tensor(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), bytes(t.data.tobytes()))
        for t in r.tensors
    ]
    end = max((t.data_offset + t.n_bytes for t in r.tensors), default=r.data_offset)
    size = path.stat().st_size
    extra = b""
    if size > end:
        with path.open("rb") as fh:
            fh.seek(end)
            extra = fh.read()
        pad = (-end) % alignment
        extra = extra[pad:] if extra[:pad] == b"\0" * pad else extra
    return GGUF(kvs, tensors, alignment, int(r.fields["GGUF.version"].parts[0][0]), extra)


def _pad(n: int, a: int) -> int:
    return -(-n // a) * a


def encode(g: GGUF) -> bytes:
    n_t = len(g.tensors) if g.n_tensors is None else g.n_tensors
    n_kv = len(g.kvs) if g.n_kv is None else g.n_kv
    out = [struct.pack("<4sIQQ", b"GGUF", g.version, n_t, n_kv)]
    for kv in g.kvs:
        out += [encode_value(STRING, kv.key), struct.pack("<I", kv.vtype), kv.raw]
    offset = 0
    for t in g.tensors:
        out += [
            encode_value(STRING, t.name),
            struct.pack(f"<I{len(t.dims)}Q", len(t.dims), *t.dims),
        ]
        out.append(struct.pack("<IQ", t.ttype, offset))
        offset = _pad(offset + len(t.data), g.alignment)
    head = b"".join(out)
    chunks = [head, b"\0" * (_pad(len(head), g.alignment) - len(head))]
    for t in g.tensors:
        chunks += [t.data, b"\0" * (_pad(len(t.data), g.alignment) - len(t.data))]
    if g.tensors:  # gguf writers pad the last tensor too; keep what follows it
        pass
    chunks.append(g.extra)
    return b"".join(chunks)


def save(g: GGUF, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(g))
    return path


@dataclass
class Split:
    """A split set: its parts in order (part 1 holds the model's keys)."""

    stem: str
    parts: list[GGUF] = field(default_factory=list)

    def names(self) -> list[str]:
        n = len(self.parts)
        return [f"{self.stem}-{i + 1:05d}-of-{n:05d}.gguf" for i in range(n)]
