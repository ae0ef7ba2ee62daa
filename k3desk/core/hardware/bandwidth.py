"""Memory bandwidth figures for speed prediction, each labelled with where it came from.

Token generation of a MoE model is bound by how fast the active weights can be
read, so the planner divides bytes touched per token by these numbers.  Sources:

- ``table``: the vendor's published figure for a GPU (or a unified-memory chip),
- ``measured``: a short multi-threaded RAM copy benchmark on this machine,
- ``override``: a number the user typed in,
- ``estimate``: theoretical channels x transfer rate x 8 bytes, from a
  description ("12ch DDR5-4800") or from a known CPU model,
- hardware files keep whatever their own numbers say.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from k3desk.core.errors import HardwareError
from k3desk.core.hardware.profile import Bandwidth, GpuInfo, HardwareProfile
from k3desk.core.units import GB, MiB

TB_S = 1e12
GB_S = 1e9


def _tb(tb_per_s: float) -> float:
    """TB/s to bytes/s, rounded to whole bytes so JSON shows 273000000000.0, not ...00003."""
    return float(round(tb_per_s * TB_S))


@dataclass(frozen=True)
class _GpuEntry:
    # every pattern must occur in the lower-cased, space-normalised NVML name
    needles: tuple[str, ...]
    # and none of these
    without: tuple[str, ...]
    bytes_per_s: float
    what: str


# Ordered: the first match wins, so specific variants precede their family.
# Figures are the vendors' published peak memory bandwidths.
_GPU_TABLE: tuple[_GpuEntry, ...] = (
    _GpuEntry(("gb10",), (), _tb(0.273), "GB10 (DGX Spark) LPDDR5x, shared with the CPU"),
    _GpuEntry(("thor",), (), _tb(0.273), "Jetson Thor LPDDR5x, shared with the CPU"),
    _GpuEntry(("gb300",), (), _tb(8.0), "GB300 HBM3e"),
    _GpuEntry(("b300",), (), _tb(8.0), "B300 HBM3e"),
    _GpuEntry(("gb200",), (), _tb(8.0), "GB200 HBM3e"),
    _GpuEntry(("b200",), (), _tb(8.0), "B200 HBM3e"),
    _GpuEntry(("b100",), (), _tb(8.0), "B100 HBM3e"),
    _GpuEntry(("gh200",), ("144",), _tb(4.0), "GH200 96 GB HBM3"),
    _GpuEntry(("gh200",), (), _tb(4.9), "GH200 144 GB HBM3e"),
    _GpuEntry(("h200",), (), _tb(4.8), "H200 HBM3e"),
    _GpuEntry(("h100", "pcie"), (), _tb(2.0), "H100 PCIe HBM2e"),
    _GpuEntry(("h100", "nvl"), (), _tb(3.9), "H100 NVL HBM3"),
    _GpuEntry(("h100",), (), _tb(3.35), "H100 SXM HBM3"),
    _GpuEntry(("h800",), ("pcie",), _tb(3.35), "H800 SXM HBM3"),
    _GpuEntry(("h800",), (), _tb(2.0), "H800 PCIe HBM2e"),
    _GpuEntry(("h20",), (), _tb(4.0), "H20 HBM3"),
    _GpuEntry(("a100", "80"), ("pcie",), _tb(2.039), "A100 80 GB SXM HBM2e"),
    _GpuEntry(("a100", "80", "pcie"), (), _tb(1.935), "A100 80 GB PCIe HBM2e"),
    _GpuEntry(("a100",), (), _tb(1.555), "A100 40 GB HBM2"),
    _GpuEntry(("a800", "80"), (), _tb(2.039), "A800 80 GB HBM2e"),
    _GpuEntry(("rtx pro 6000", "blackwell"), (), _tb(1.792), "RTX PRO 6000 Blackwell GDDR7"),
    _GpuEntry(("rtx pro 5000", "blackwell"), (), _tb(1.344), "RTX PRO 5000 Blackwell GDDR7"),
    _GpuEntry(("rtx pro 4000", "blackwell"), (), _tb(0.672), "RTX PRO 4000 Blackwell GDDR7"),
    _GpuEntry(("rtx 6000 ada",), (), _tb(0.960), "RTX 6000 Ada GDDR6"),
    _GpuEntry(("rtx a6000",), (), _tb(0.768), "RTX A6000 GDDR6"),
    _GpuEntry(("l40",), (), _tb(0.864), "L40/L40S GDDR6"),
    _GpuEntry(("a40",), (), _tb(0.696), "A40 GDDR6"),
    _GpuEntry(("a10",), ("a100",), _tb(0.600), "A10 GDDR6"),
    _GpuEntry(("l4",), ("l40",), _tb(0.300), "L4 GDDR6"),
    _GpuEntry(("v100",), (), _tb(0.900), "V100 HBM2"),
    _GpuEntry(("rtx 5090",), (), _tb(1.792), "GeForce RTX 5090 GDDR7"),
    _GpuEntry(("rtx 5080",), (), _tb(0.960), "GeForce RTX 5080 GDDR7"),
    _GpuEntry(("rtx 5070 ti",), (), _tb(0.896), "GeForce RTX 5070 Ti GDDR7"),
    _GpuEntry(("rtx 5070",), (), _tb(0.672), "GeForce RTX 5070 GDDR7"),
    _GpuEntry(("rtx 4090",), (), _tb(1.008), "GeForce RTX 4090 GDDR6X"),
    _GpuEntry(("rtx 4080",), (), _tb(0.717), "GeForce RTX 4080 GDDR6X"),
    _GpuEntry(("rtx 4070 ti",), (), _tb(0.504), "GeForce RTX 4070 Ti GDDR6X"),
    _GpuEntry(("rtx 4070",), (), _tb(0.504), "GeForce RTX 4070 GDDR6X"),
    _GpuEntry(("rtx 4060 ti",), (), _tb(0.288), "GeForce RTX 4060 Ti GDDR6"),
    _GpuEntry(("rtx 3090 ti",), (), _tb(1.008), "GeForce RTX 3090 Ti GDDR6X"),
    _GpuEntry(("rtx 3090",), (), _tb(0.936), "GeForce RTX 3090 GDDR6X"),
    _GpuEntry(("rtx 3080 ti",), (), _tb(0.912), "GeForce RTX 3080 Ti GDDR6X"),
    _GpuEntry(("rtx 3080",), (), _tb(0.760), "GeForce RTX 3080 GDDR6X"),
    _GpuEntry(("rtx 3060",), (), _tb(0.360), "GeForce RTX 3060 GDDR6"),
)


def _normalise_name(name: str) -> str:
    n = name.lower().replace("-", " ").replace("_", " ")
    return " ".join(n.split())


def gpu_bandwidth_from_table(name: str) -> Bandwidth:
    """The published memory bandwidth of a GPU by its NVML name, or ``unknown``."""
    n = _normalise_name(name)
    for entry in _GPU_TABLE:
        if all(x in n for x in entry.needles) and not any(x in n for x in entry.without):
            return Bandwidth(entry.bytes_per_s, "table", f"published figure for {entry.what}")
    return Bandwidth(0.0, "unknown", f"no published bandwidth known for {name!r}")


# ------------------------------------------------------------------ RAM estimates


@dataclass(frozen=True)
class _CpuMemory:
    pattern: re.Pattern[str]
    channels: int  # per socket
    mt_per_s: int
    kind: str
    what: str


def _cpu(pattern: str, channels: int, mt: int, kind: str, what: str) -> _CpuMemory:
    return _CpuMemory(re.compile(pattern, re.IGNORECASE), channels, mt, kind, what)


# Ordered: the first match wins.  Channel counts are per socket at the highest
# speed the platform supports with one DIMM per channel.
_CPU_TABLE: tuple[_CpuMemory, ...] = (
    _cpu(r"\bGB10\b|Cortex-X925", 0, 0, "", "GB10"),  # unified: handled below
    _cpu(r"\bGrace\b|Neoverse-V2", 0, 0, "", "Grace"),  # LPDDR5x: handled below
    _cpu(r"EPYC\s+9\d\d5", 12, 6000, "DDR5", "EPYC 9005 (Turin)"),
    _cpu(r"EPYC\s+9\d\d4", 12, 4800, "DDR5", "EPYC 9004 (Genoa)"),
    _cpu(r"EPYC\s+8\d\d4", 6, 4800, "DDR5", "EPYC 8004 (Siena)"),
    _cpu(r"EPYC\s+7\d\d3", 8, 3200, "DDR4", "EPYC 7003 (Milan)"),
    _cpu(r"EPYC\s+7\d\d2", 8, 3200, "DDR4", "EPYC 7002 (Rome)"),
    _cpu(r"EPYC\s+7\d\d1", 8, 2666, "DDR4", "EPYC 7001 (Naples)"),
    _cpu(r"Threadripper\s+PRO\s+99\d5", 8, 6400, "DDR5", "Threadripper PRO 9000"),
    _cpu(r"Threadripper\s+PRO\s+79\d5", 8, 5200, "DDR5", "Threadripper PRO 7000"),
    _cpu(r"Threadripper\s+PRO", 8, 3200, "DDR4", "Threadripper PRO 3000/5000"),
    _cpu(r"Threadripper\s+(79|99)\d0", 4, 5200, "DDR5", "Threadripper 7000/9000"),
    _cpu(r"Xeon.*\b6[79]\d\d[PE]\b", 12, 6400, "DDR5", "Xeon 6 (Granite Rapids)"),
    _cpu(r"Xeon.*\b85\d\d", 8, 5600, "DDR5", "Xeon 5th gen (Emerald Rapids)"),
    _cpu(r"Xeon.*\b84\d\d", 8, 4800, "DDR5", "Xeon 4th gen (Sapphire Rapids)"),
    _cpu(r"Xeon\s+w[579]-3\d\d5", 8, 4800, "DDR5", "Xeon W-3400 (Sapphire Rapids)"),
    _cpu(r"Xeon.*\b83\d\d", 8, 3200, "DDR4", "Xeon 3rd gen (Ice Lake)"),
    _cpu(r"Ryzen.*\b9\d\d\dX", 2, 5600, "DDR5", "Ryzen 9000 desktop"),
    _cpu(r"Ryzen.*\b7\d\d\dX", 2, 5200, "DDR5", "Ryzen 7000 desktop"),
    _cpu(r"Core.*Ultra", 2, 5600, "DDR5", "Core Ultra"),
    _cpu(r"1[34]th Gen Intel", 2, 5600, "DDR5", "Core 13th/14th gen"),
)

_DESCRIPTION = re.compile(
    r"(?P<ch>\d+)\s*[- ]?\s*(?:ch|channels?)\b[^0-9]*?"
    r"(?P<kind>LP)?DDR(?P<gen>\d)X?\s*[- ]?\s*(?P<mt>\d{3,5})",
    re.IGNORECASE,
)


def ram_bandwidth_from_channels(
    channels: int, mt_per_s: int, sockets: int = 1, *, what: str = ""
) -> Bandwidth:
    """Theoretical peak: channels x transfers per second x 8 bytes (x sockets)."""
    if channels <= 0 or mt_per_s <= 0 or sockets <= 0:
        raise HardwareError(
            f"Cannot estimate RAM bandwidth from {channels} channels at {mt_per_s} MT/s "
            f"on {sockets} socket(s).",
            "Give a positive channel count and memory speed, e.g. '12ch DDR5-4800'.",
        )
    bps = float(channels) * mt_per_s * 1e6 * 8 * sockets
    per = f"{sockets} x " if sockets > 1 else ""
    note = (
        f"theoretical peak {per}{channels} channels x {mt_per_s} MT/s x 8 B = {bps / GB_S:.1f} GB/s"
    )
    if what:
        note = f"{what}: {note}"
    return Bandwidth(bps, "estimate", note)


def estimate_ram_bandwidth(description: str, sockets: int = 1) -> Bandwidth:
    """Estimate RAM bandwidth when nothing was measured.

    ``description`` is either a memory description ("12ch DDR5-4800",
    "8-channel DDR4-3200") or a CPU model name ("AMD EPYC 9554P 64-Core
    Processor").  Unknown descriptions fall back to dual-channel DDR4-3200 and
    say so in the note.
    """
    m = _DESCRIPTION.search(description)
    if m:
        return ram_bandwidth_from_channels(
            int(m["ch"]), int(m["mt"]), sockets, what=description.strip()
        )
    for entry in _CPU_TABLE:
        if not entry.pattern.search(description):
            continue
        if entry.what == "GB10":
            return Bandwidth(
                _tb(0.273),
                "table",
                "GB10: 256-bit LPDDR5x-8533 = 273 GB/s, shared by the CPU and the GPU",
            )
        if entry.what == "Grace":
            return Bandwidth(
                _tb(0.5) * sockets, "table", f"Grace LPDDR5x: up to 500 GB/s per CPU x {sockets}"
            )
        return ram_bandwidth_from_channels(
            entry.channels,
            entry.mt_per_s,
            sockets,
            what=f"{entry.what}, {entry.channels}ch {entry.kind}-{entry.mt_per_s} per socket",
        )
    bw = ram_bandwidth_from_channels(2, 3200, sockets)
    return replace(
        bw,
        note=f"unknown platform {description.strip()!r}; assumed dual-channel DDR4-3200: "
        f"{bw.bytes_per_s / GB_S:.1f} GB/s; the benchmark (without --no-benchmark) measures it.",
    )


# ------------------------------------------------------------------ measured


def measure_ram_bandwidth(
    *,
    buffer_bytes: int = 256 * MiB,
    threads: int = 1,
    repeats: int = 4,
    clock: Callable[[], float] = time.perf_counter,
) -> Bandwidth:
    """Copy a buffer a few times with ``threads`` threads and keep the best run.

    Counted the STREAM way: a copy reads and writes ``buffer_bytes`` each, so
    the traffic is twice the buffer.  Takes about 0.1-0.3 s for 256 MiB; the
    source and destination together hold ``2 * buffer_bytes`` of RAM briefly.
    """
    import numpy as np

    if buffer_bytes < MiB or threads < 1 or repeats < 1:
        raise HardwareError(
            "The RAM benchmark needs at least 1 MiB, one thread and one run.",
            "Use `k3desk doctor --no-benchmark` to skip it.",
        )
    n = buffer_bytes // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    dst.fill(0.0)  # fault the pages in before timing
    bounds = [n * i // threads for i in range(threads + 1)]
    slices = [(bounds[i], bounds[i + 1]) for i in range(threads)]

    def copy(part: tuple[int, int]) -> None:
        a, b = part
        np.copyto(dst[a:b], src[a:b])  # releases the GIL for plain dtypes

    best = math.inf
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for _ in range(repeats):
            t0 = clock()
            list(pool.map(copy, slices))
            best = min(best, clock() - t0)
    best = max(best, 1e-9)
    traffic = 2 * n * 8
    bps = traffic / best
    return Bandwidth(
        bps,
        "measured",
        f"best of {repeats} copies of {n * 8 // MiB} MiB with {threads} thread(s): "
        f"{bps / GB_S:.1f} GB/s (a lower bound; the theoretical peak is higher)",
    )


def benchmark_threads(usable_cores: int) -> int:
    """Threads for the copy benchmark: enough to load several memory channels."""
    return max(1, min(usable_cores, 16))


# ------------------------------------------------------------------ overrides and files


def with_bandwidth_override(
    profile: HardwareProfile,
    *,
    ram_gb_s: float | None = None,
    gpu_gb_s: dict[int, float] | None = None,
) -> HardwareProfile:
    """Replace bandwidth figures with the user's own (GB/s), labelled ``override``."""
    memory = profile.memory
    if ram_gb_s is not None:
        memory = replace(memory, bandwidth=_override(ram_gb_s, "RAM"))
    gpus = list(profile.gpus)
    for index, value in (gpu_gb_s or {}).items():
        pos = next((i for i, g in enumerate(gpus) if g.index == index), None)
        if pos is None:
            known = ", ".join(str(g.index) for g in gpus) or "none"
            raise HardwareError(
                f"There is no GPU {index} to set a bandwidth for (GPUs: {known}).",
                "Use the index `k3desk doctor` shows.",
            )
        gpus[pos] = replace(gpus[pos], bandwidth=_override(value, f"GPU {index}"))
    return replace(profile, memory=memory, gpus=tuple(gpus))


def _override(gb_s: float, what: str) -> Bandwidth:
    if not math.isfinite(gb_s) or gb_s <= 0:
        raise HardwareError(
            f"The {what} bandwidth override must be a positive number of GB/s, not {gb_s!r}."
        )
    return Bandwidth(gb_s * GB_S, "override", f"set by the user: {gb_s:g} GB/s")


def with_ram_bandwidth(profile: HardwareProfile, bw: Bandwidth) -> HardwareProfile:
    """``profile`` with ``bw`` as its RAM bandwidth, and as that of each unified-memory
    GPU whose figure was the RAM's (no published one: see :func:`detect_hardware`)."""
    gpus = tuple(
        replace(g, bandwidth=replace(bw, note="unified memory: " + bw.note))
        if g.unified_memory and g.bandwidth.note.startswith("unified memory: ")
        else g
        for g in profile.gpus
    )
    return replace(profile, memory=replace(profile.memory, bandwidth=bw), gpus=gpus)


def fill_missing_bandwidths(profile: HardwareProfile) -> HardwareProfile:
    """Keep every figure a profile (e.g. a hardware file) gives; fill only unknown ones.

    GPUs get the table figure for their name; unified-memory GPUs with no table
    entry share the RAM figure; RAM gets an estimate from the CPU model.
    """
    memory = profile.memory
    if memory.bandwidth.source == "unknown" or memory.bandwidth.bytes_per_s <= 0:
        memory = replace(
            memory, bandwidth=estimate_ram_bandwidth(profile.cpu.model, profile.cpu.sockets)
        )
    gpus: list[GpuInfo] = []
    for g in profile.gpus:
        if g.bandwidth.source == "unknown" or g.bandwidth.bytes_per_s <= 0:
            bw = gpu_bandwidth_from_table(g.name)
            if bw.source == "unknown" and g.unified_memory:
                bw = replace(memory.bandwidth, note="unified memory: " + memory.bandwidth.note)
            g = replace(g, bandwidth=bw)
        gpus.append(g)
    return replace(profile, memory=memory, gpus=tuple(gpus))


def fmt_bandwidth(bw: Bandwidth) -> str:
    """'3.35 TB/s (table)', '41.2 GB/s (measured)', 'unknown'."""
    if bw.bytes_per_s <= 0:
        return "unknown"
    if bw.bytes_per_s >= TB_S:
        return f"{bw.bytes_per_s / TB_S:.2f} TB/s ({bw.source})"
    return f"{bw.bytes_per_s / GB:.1f} GB/s ({bw.source})"
