"""Which weights llama.cpp's CPU backend repacks into anonymous memory.

llama.cpp b11434 gives the CPU two buffer types for weights: the plain one, which
an mmap'd model file backs directly (page cache: evictable, re-read from the file
on demand), and the "extra" ``CPU_REPACK`` type (``make_cpu_buft_list`` in
``src/llama-model.cpp``, used unless ``--no-repack`` clears ``use_extra_bufts``).
A weight goes to ``CPU_REPACK`` when the CPU backend can run its matrix
multiplication from an interleaved copy: ``extra_buffer_type::supports_op`` in
``ggml/src/ggml-cpu/repack.cpp`` accepts a 2-D ``MUL_MAT`` or 3-D ``MUL_MAT_ID``
weight whose type ``ggml_repack_get_optimal_repack_type`` has a kernel for on
this CPU.  Such a weight is not mapped: the loader allocates a ``CPU_REPACK``
buffer (``malloc``'d, anonymous memory that only swap can move) and copies the
file's bytes into it, interleaved.  When those buffers do not fit, the load stops
with "unable to allocate CPU_REPACK buffer".

On x86 (``ggml_repack_get_optimal_repack_type``, b11434): with AVX2, Q4_0, Q4_K,
IQ4_NL and MXFP4 whose row count (``ne[1]``) is a multiple of 8; with AVX-512
also Q2_K.  On ARM with the dot-product extension: Q4_0, Q4_K, Q5_K, Q6_K,
IQ4_NL, MXFP4, Q8_0 and Q1_0 (rows a multiple of 4 or 8).  The token embedding
is read with ``GET_ROWS``, not multiplied, and stays mapped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from k3desk.core.gguf.model import ModelLayout, TensorEntry
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.k3arch import is_expert_tensor, layer_of
from k3desk.core.planning.argv import NO_REPACK

NO_REPACK_FLAGS = NO_REPACK.names

# type -> the row count (ne[1]) a repacked kernel needs a multiple of
_X86_AVX2 = {"Q4_0": 8, "Q4_K": 8, "IQ4_NL": 8, "MXFP4": 8}
_X86_AVX512 = {**_X86_AVX2, "Q2_K": 8}
_ARM_DOTPROD = {
    "Q4_0": 4,
    "Q4_K": 8,
    "Q5_K": 8,
    "Q6_K": 8,
    "IQ4_NL": 4,
    "MXFP4": 4,
    "Q8_0": 4,
    "Q1_0": 4,
}


def repacked_types(hw: HardwareProfile) -> Mapping[str, int]:
    """The tensor types this CPU's backend repacks, with the row multiple each needs."""
    flags = hw.cpu.flags
    if "avx512f" in flags:
        return _X86_AVX512
    if "avx2" in flags:
        return _X86_AVX2
    if "asimddp" in flags or "dotprod" in flags:
        return _ARM_DOTPROD
    return {}


def is_repacked(t: TensorEntry, types: Mapping[str, int]) -> bool:
    """Whether ggml-cpu would hold ``t`` in a ``CPU_REPACK`` buffer (if it is on the CPU)."""
    multiple = types.get(t.type_name)
    if multiple is None or t.name.startswith("token_embd."):
        return False
    dims = len(t.shape)
    if dims not in (2, 3) or not t.name.endswith(".weight"):
        return False
    return t.shape[1] % multiple == 0


def repack_bytes(
    hw: HardwareProfile,
    layout: ModelLayout,
    expert_in_ram: Iterable[int],
    dense_in_ram: Iterable[int],
    output_in_ram: bool,
) -> int:
    """Bytes of anonymous memory the CPU_REPACK buffers take for the weights kept in RAM:
    the routed experts of layers ``expert_in_ram``, the other weights of layers
    ``dense_in_ram``, and the output matrix when ``output_in_ram``."""
    types = repacked_types(hw)
    if not types:
        return 0
    experts, dense = set(expert_in_ram), set(dense_in_ram)
    total = 0
    for t in layout.tensors:
        if not is_repacked(t, types):
            continue
        layer = layer_of(t.name)
        if layer is None:
            here = output_in_ram
        elif is_expert_tensor(t.name):
            here = layer in experts
        else:
            here = layer in dense
        if here:
            total += t.nbytes
    return total
