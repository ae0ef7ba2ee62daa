"""ggml tensor types: id, name, block size and bytes per block: the one table k3desk uses.

The source is llama.cpp b11434: ``enum ggml_type`` in ``ggml/include/ggml.h`` (ids),
``type_traits`` in ``ggml/src/ggml.c`` (``blck_size``, ``type_size``) and
``GGML_QUANT_SIZES`` in ``gguf-py/gguf/constants.py``.  Header inspection, size
estimates, the quality order and the node-side header check all read it here
rather than from the ``gguf`` package, whose import pulls in numpy and its reader
(about 0.1 s) and which lags the engine by a type.
A test checks this table against ``gguf.GGML_QUANT_SIZES``.  The table holds
exactly the types llama.cpp b11434 reads (``enum ggml_type`` in ggml.h, up to
``GGML_TYPE_COUNT`` = 43, less the removed ids 4, 5, 31-33 and 36-38): any other
id is refused by that build's ``gguf_init_from_reader``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block

    def nbytes(self, n_elements: int) -> int:
        return n_elements // self.block_size * self.type_size

    @property
    def bits_per_weight(self) -> float:
        return self.type_size * 8 / self.block_size


_TABLE = (
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22), (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84), (11, "Q3_K", 256, 110), (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176), (14, "Q6_K", 256, 210), (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66), (17, "IQ2_XS", 256, 74), (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82), (23, "IQ4_XS", 256, 136), (24, "I8", 1, 1), (25, "I16", 1, 2),
    (26, "I32", 1, 4), (27, "I64", 1, 8), (28, "F64", 1, 8), (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2), (34, "TQ1_0", 256, 54), (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17), (40, "NVFP4", 64, 36), (41, "Q1_0", 128, 18),
    (42, "Q2_0", 64, 18),  # QK2_0 64, block_q2_0 = half + 16 bytes (ggml-common.h, b11434)
)  # fmt: skip

BY_ID: dict[int, GGMLType] = {t[0]: GGMLType(*t) for t in _TABLE}
BY_NAME: dict[str, GGMLType] = {t.name: t for t in BY_ID.values()}


def type_name(type_id: int) -> str:
    t = BY_ID.get(type_id)
    return t.name if t else f"type#{type_id}"
