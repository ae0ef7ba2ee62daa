"""Hostile GGUF headers, for the tests and the bench: each claims far more than it has.

Huge counts (layers, experts, tensors, keys, array and string lengths,
dimensions), per-layer keys as scalars or as arrays of the wrong length, and
sparse files whose claimed strings and arrays are holes.  :data:`HOSTILE` maps a
name to (builder, a phrase the refusal must contain); a builder takes a tiny
valid model and a folder and writes the hostile file.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from k3desk.core.gguf.reader import MAX_STRING_ARRAY
from tests.oracle import gguf_edit as ge

REPO = Path(__file__).resolve().parents[2]
MAX_SECONDS = 1.0
MAX_RSS = 64 * 1024 * 1024
GiB = 1 << 30

UINT32, INT32, STRING, ARRAY = ge.UINT32, ge.INT32, ge.STRING, ge.ARRAY


def _s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, raw: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + raw


def _u32(key: str, v: int) -> bytes:
    return _kv(key, UINT32, struct.pack("<I", v))


def _head(n_tensors: int, n_kv: int) -> bytes:
    return struct.pack("<4sIQQ", b"GGUF", 3, n_tensors, n_kv)


def _sparse(path: Path, pieces: list[tuple[int, bytes]], size: int = 0) -> Path:
    """Write ``pieces`` (offset, bytes) with holes between them; at least ``size`` bytes."""
    with path.open("wb") as f:
        end = 0
        for offset, data in pieces:
            f.seek(offset)
            f.write(data)
            end = max(end, offset + len(data))
        f.truncate(max(end, size))
    return path


Builder = Callable[[Path, Path], Path]  # (tiny model, folder) -> the hostile file


def _edited(edit: Callable[[ge.GGUF], ge.GGUF]) -> Builder:
    def build(tiny: Path, d: Path) -> Path:
        return ge.save(edit(ge.load(tiny)), d / "hostile.gguf")

    return build


def huge_block_count_scalar_kv(g: ge.GGUF) -> ge.GGUF:
    """The 850 KB file that used to grow validate past 5.8 GB."""
    g = g.set(ge.KV.of("kimi-k3.block_count", UINT32, 2_000_000))
    return g.set(ge.KV.of("kimi-k3.attention.head_count_kv", UINT32, 1))


def huge_block_count_array_kv(g: ge.GGUF) -> ge.GGUF:
    g = g.set(ge.KV.of("kimi-k3.block_count", UINT32, 2_000_000))
    return g.set(ge.KV.of("kimi-k3.attention.head_count_kv", ARRAY, [0] * 2_000_000, INT32))


def huge_expert_count(g: ge.GGUF) -> ge.GGUF:
    return g.set(ge.KV.of("kimi-k3.expert_count", UINT32, 1 << 31))


def per_layer_array_in_a_hole(tiny: Path, d: Path) -> Path:
    """expert_used_count as a UINT32 array of 2^28 entries: a 1 GiB hole, then the rest."""
    g = ge.load(tiny).drop_key("kimi-k3.expert_used_count")
    body = ge.encode(g)
    head = _head(len(g.tensors), len(g.kvs) + 1)
    n = 1 << 28
    key = _s("kimi-k3.expert_used_count") + struct.pack("<IIQ", ARRAY, UINT32, n)
    first = head + key
    return _sparse(d / "hostile.gguf", [(0, first), (len(first) + 4 * n, body[24:])])


def _string_in_a_hole(as_key: bool) -> Builder:
    """A 900 MiB string (a key name, or general.name's value) whose bytes are a hole."""

    def build(tiny: Path, d: Path) -> Path:
        g = ge.load(tiny).drop_key("general.name")
        body = ge.encode(g)
        n = 900 << 20
        if as_key:
            first = _head(len(g.tensors), len(g.kvs) + 1) + struct.pack("<Q", n)
            rest = struct.pack("<I", UINT32) + struct.pack("<I", 1) + body[24:]
        else:
            first = _head(len(g.tensors), len(g.kvs) + 1) + _s("general.name")
            first += struct.pack("<IQ", STRING, n)
            rest = body[24:]
        return _sparse(d / "hostile.gguf", [(0, first), (len(first) + n, rest)])

    return build


def empty_strings_in_a_hole(tiny: Path, d: Path) -> Path:
    """tokenizer.ggml.tokens as 2,097,152 empty strings (16 MiB of zeros, a hole): the
    longest walk the limits allow, then the rest of a real header."""
    g = ge.load(tiny)
    tokens = g.kv("tokenizer.ggml.tokens")
    assert tokens is not None
    kvs = [kv for kv in g.kvs if kv.key != tokens.key]
    g = ge.GGUF(kvs, g.tensors)
    body = ge.encode(g)
    n = MAX_STRING_ARRAY
    first = _head(len(g.tensors), len(g.kvs) + 1) + _s(tokens.key)
    first += struct.pack("<IIQ", ARRAY, STRING, n)
    return _sparse(d / "hostile.gguf", [(0, first), (len(first) + 8 * n, body[24:])])


def _raw(pieces: Callable[[], bytes], size: int = 0) -> Builder:
    def build(tiny: Path, d: Path) -> Path:
        return _sparse(d / "hostile.gguf", [(0, pieces())], size)

    return build


def _one_tensor(name: bytes, dims: list[int], n_dims: int | None = None, ttype: int = 0) -> bytes:
    nd = len(dims) if n_dims is None else n_dims
    info = _s(name) + struct.pack("<I", nd) + b"".join(struct.pack("<Q", x) for x in dims)
    return (
        _head(1, 1)
        + _kv("general.architecture", STRING, _s("kimi-k3"))
        + info
        + struct.pack("<IQ", ttype, 0)
    )


def _array_kv(key: str, etype: int, count: int, then: bytes = b"") -> bytes:
    """A file of one array key that claims ``count`` elements of ``etype``."""
    return _head(0, 1) + _s(key) + struct.pack("<IIQ", ARRAY, etype, count) + then


def split_of_65535(tiny: Path, d: Path) -> Path:
    g = ge.load(tiny).set(ge.KV.of("split.no", ge.UINT16, 0))
    g = g.set(ge.KV.of("split.count", ge.UINT16, 65535))
    g = g.set(ge.KV.of("split.tensors.count", INT32, 10**6))
    return ge.save(g, d / "hostile-00001-of-65535.gguf")


HOSTILE: dict[str, tuple[Builder, str]] = {
    "block_count 2,000,000, scalar head_count_kv": (
        _edited(huge_block_count_scalar_kv), "block_count is 2,000,000"),
    "block_count 2,000,000, head_count_kv of 2,000,000": (
        _edited(huge_block_count_array_kv), "block_count is 2,000,000"),
    "expert_count 2^31": (_edited(huge_expert_count), "expert_count is 2,147,483,648"),
    "expert_used_count array of 2^28 in a hole": (
        per_layer_array_in_a_hole, "268,435,456 entries for 6 layers"),
    "900 MiB string value in a hole": (_string_in_a_hole(False), "a string of 900.0 MiB"),
    "900 MiB key in a hole": (_string_in_a_hole(True), "a string of 900.0 MiB"),
    "2,097,152 empty tokens in a hole": (empty_strings_in_a_hole, "2,097,152 tokens"),
    "2^63-1 tensors": (_raw(lambda: _head((1 << 63) - 1, 1)), "9,223,372,036,854,775,807 tensors"),
    "10^12 keys": (_raw(lambda: _head(0, 10**12)), "1,000,000,000,000 metadata keys"),
    "60,000 tensors in a 1 KiB file": (_raw(lambda: _head(60_000, 0), 1024), "truncated"),
    "2^40 tokens": (
        _raw(lambda: _array_kv("tokenizer.ggml.tokens", STRING, 1 << 40)),
        "1,099,511,627,776 elements"),
    "a 2 GiB numeric array in a 1 GiB hole": (
        _raw(lambda: _array_kv("x", UINT32, 1 << 29), GiB), "truncated"),
    "nested array": (_raw(lambda: _array_kv("x", ARRAY, 1)), "nested arrays"),
    "a string of 2^62 bytes in an array": (
        _raw(lambda: _array_kv("tokenizer.ggml.merges", STRING, 1, struct.pack("<Q", 1 << 62))),
        "a string of"),
    "tensor with 2^32-1 dimensions": (_raw(lambda: _one_tensor(b"t", [], n_dims=2**32 - 1)),
                                      "4,294,967,295 dimensions"),
    "tensor of 2^40 x 2^40 elements": (_raw(lambda: _one_tensor(b"t", [1 << 40, 1 << 40])),
                                       "more than ggml can count"),
    "tensor name of 2^60 bytes": (
        _raw(lambda: _head(1, 0) + struct.pack("<Q", 1 << 60), 1 << 20), "has a name of"),
    "tensor of 2^50 bytes in a small file": (
        _raw(lambda: _one_tensor(b"token_embd.weight", [1 << 48, 4])), "truncated"),
    "split.count 65,535": (split_of_65535, "missing"),
}  # fmt: skip


# Runs the command and reports its peak RSS.  A child forked from pytest would
# inherit pytest's high-water mark (exec keeps it: exec_mmap), so the command is
# started from this small launcher instead, whose own footprint is smaller.
_LAUNCHER = """
import json, resource, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": p.returncode, "out": p.stdout, "err": p.stderr, "kib": usage.ru_maxrss}))
"""


def run_cli(path: Path) -> tuple[int, str, str, int]:
    """``k3desk validate PATH`` in its own process: (exit status, stdout, stderr, peak RSS
    in bytes)."""
    out = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, sys.executable, "-m", "k3desk", "validate", str(path)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    r = json.loads(out.stdout)
    return r["rc"], r["out"], r["err"], r["kib"] * 1024  # Linux reports KiB
