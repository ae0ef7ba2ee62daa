"""The hardware profile: one frozen object describing a machine.

The JSON form (``to_json``/``from_json``) is what ``k3desk doctor --json``
prints and what every planning command accepts with ``--hardware FILE``, so a
person can plan for a machine they do not have yet.  Sizes are bytes,
bandwidths bytes per second.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from k3desk.core.errors import HardwareError
from k3desk.core.localfiles import DamagedRecord, load_json
from k3desk.core.resources import resources_dir

PROFILE_SCHEMA = 1

BandwidthSource = Literal["table", "measured", "override", "estimate", "unknown"]
BANDWIDTH_SOURCES: tuple[str, ...] = ("table", "measured", "override", "estimate", "unknown")


@dataclass(frozen=True)
class Bandwidth:
    """A memory bandwidth estimate and where it came from."""

    bytes_per_s: float
    source: BandwidthSource
    note: str = ""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    vram_total: int
    vram_free: int
    compute_capability: tuple[int, int]
    # "Hopper", "Blackwell", "Ada Lovelace", "Ampere", ... from the compute capability
    architecture: str
    # Unified memory (GB10 / DGX Spark, Thor): VRAM is system RAM; budget from RAM.
    unified_memory: bool = False
    bandwidth: Bandwidth = field(default_factory=lambda: Bandwidth(0.0, "unknown"))
    uuid: str = ""

    @property
    def sm(self) -> str:
        """CUDA architecture number as used by CMAKE_CUDA_ARCHITECTURES, e.g. '90', '121'."""
        return f"{self.compute_capability[0]}{self.compute_capability[1]}"


@dataclass(frozen=True)
class CpuInfo:
    model: str
    logical_cores: int
    physical_cores: int
    usable_cores: int  # after affinity and cgroup cpu.max
    # lower-case /proc/cpuinfo flag names relevant to llama.cpp builds:
    # avx, avx2, fma, f16c, bmi2, avx512f, avx512bw, avx512_vnni, avx512_bf16,
    # amx_tile, amx_int8, amx_bf16, sve (arm), ...
    flags: frozenset[str] = frozenset()
    sockets: int = 1
    numa_nodes: int = 1  # NUMA nodes with memory (llama.cpp --numa matters above 1)

    @property
    def has_avx2(self) -> bool:
        return "avx2" in self.flags

    @property
    def has_avx512(self) -> bool:
        return "avx512f" in self.flags

    @property
    def has_amx(self) -> bool:
        return "amx_tile" in self.flags


@dataclass(frozen=True)
class MemoryInfo:
    total: int
    available: int
    swap_total: int
    cgroup_limit: int | None = None  # bytes, None when unlimited
    bandwidth: Bandwidth = field(default_factory=lambda: Bandwidth(0.0, "unknown"))

    @property
    def usable_total(self) -> int:
        """Total RAM the process may use (the cgroup limit caps it)."""
        if self.cgroup_limit is not None:
            return min(self.total, self.cgroup_limit)
        return self.total


@dataclass(frozen=True)
class DiskInfo:
    path: str  # the folder asked about
    probed_path: str  # the nearest existing parent actually measured
    free: int
    total: int
    filesystem: str = ""  # e.g. ext4, xfs, vfat (vfat cannot hold files over 4 GiB)


@dataclass(frozen=True)
class HardwareProfile:
    cpu: CpuInfo
    memory: MemoryInfo
    gpus: tuple[GpuInfo, ...] = ()
    # why the GPU list is empty, e.g. "NVIDIA driver not found (libnvidia-ml.so.1)"
    gpu_note: str = ""
    driver_version: str = ""
    cuda_driver_version: str = ""
    disk: DiskInfo | None = None
    hostname: str = ""
    # "detected" or the file it was read from
    source: str = "detected"
    # A name for hardware files (e.g. "8x H100 + 2 TB RAM")
    label: str = ""

    @property
    def total_vram(self) -> int:
        return sum(g.vram_total for g in self.gpus if not g.unified_memory)

    @property
    def has_unified_memory(self) -> bool:
        return any(g.unified_memory for g in self.gpus)

    # ------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = PROFILE_SCHEMA
        d["cpu"]["flags"] = sorted(self.cpu.flags)
        for g in d["gpus"]:
            g["compute_capability"] = list(g["compute_capability"])
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "") -> HardwareProfile:
        try:
            cpu_d = dict(d["cpu"])
            cpu_d["flags"] = frozenset(str(f).lower() for f in cpu_d.get("flags", ()))
            cpu = CpuInfo(**cpu_d)
            mem_d = dict(d["memory"])
            if isinstance(mem_d.get("bandwidth"), dict):
                mem_d["bandwidth"] = Bandwidth(**mem_d["bandwidth"])
            memory = MemoryInfo(**mem_d)
            gpus = []
            for g in d.get("gpus", ()):
                g = dict(g)
                g["compute_capability"] = tuple(int(x) for x in g["compute_capability"])
                if isinstance(g.get("bandwidth"), dict):
                    g["bandwidth"] = Bandwidth(**g["bandwidth"])
                gpus.append(GpuInfo(**g))
            disk = DiskInfo(**d["disk"]) if d.get("disk") else None
        except (KeyError, TypeError, ValueError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise HardwareError(
                f"The hardware description{' ' + source if source else ''} is malformed: {what}",
                "Start from the output of `k3desk doctor --json` and edit the numbers.",
            ) from exc
        _check_values(cpu, memory, gpus, disk, source)
        return cls(
            cpu=cpu,
            memory=memory,
            gpus=tuple(gpus),
            gpu_note=str(d.get("gpu_note", "")),
            driver_version=str(d.get("driver_version", "")),
            cuda_driver_version=str(d.get("cuda_driver_version", "")),
            disk=disk,
            hostname=str(d.get("hostname", "")),
            source=source or str(d.get("source", "file")),
            label=str(d.get("label", "")),
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> HardwareProfile:
        p = Path(path)
        try:
            data = load_json(p, what="hardware file")
        except DamagedRecord as exc:
            if exc.content:
                raise HardwareError(
                    f"Hardware file {p} is not valid JSON: {exc.why}.",
                    "Start from the output of `k3desk doctor --json`.",
                ) from None
            raise HardwareError(
                f"Hardware file {p} cannot be used: {exc.why}.", _hardware_file_hint()
            ) from None
        except OSError as exc:
            raise HardwareError(
                f"Hardware file {p} cannot be read: {exc.strerror or exc}.",
                _hardware_file_hint(),
            ) from None
        if data is None:
            raise HardwareError(f"Hardware file {p} does not exist.", _hardware_file_hint())
        if not isinstance(data, dict):
            raise HardwareError(f"Hardware file {p} must hold a JSON object.")
        return cls.from_dict(data, source=str(p))


def _hardware_file_hint() -> str:
    examples = resources_dir() / "hardware"
    names = sorted(f.name for f in examples.glob("*.json")) if examples.is_dir() else []
    shown = f" ({', '.join(names[:3])}, ...)" if names else ""
    return (
        "Save one on the machine to plan for with `k3desk doctor --json > FILE`, "
        f"or use an example from {examples}{shown}."
    )


def _check_values(
    cpu: CpuInfo,
    memory: MemoryInfo,
    gpus: list[GpuInfo],
    disk: DiskInfo | None,
    source: str,
) -> None:
    """Reject values of the wrong type or sign, naming the field (a typo must not plan)."""
    problems: list[str] = []

    def count(name: str, value: object, minimum: int = 0) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            problems.append(f"{name} must be a whole number >= {minimum}, not {value!r}")

    def bandwidth(name: str, bw: object) -> None:
        if not isinstance(bw, Bandwidth):
            problems.append(f"{name} must be an object with bytes_per_s and source")
            return
        bps = bw.bytes_per_s
        if isinstance(bps, bool) or not isinstance(bps, int | float) or bps < 0:
            problems.append(f"{name}.bytes_per_s must be a number >= 0, not {bps!r}")
        if bw.source not in BANDWIDTH_SOURCES:
            problems.append(
                f"{name}.source must be one of {', '.join(BANDWIDTH_SOURCES)}, not {bw.source!r}"
            )

    def text(name: str, value: object) -> None:
        if not isinstance(value, str) or not value:
            problems.append(f"{name} must be non-empty text, not {value!r}")

    text("cpu.model", cpu.model)
    for name in ("logical_cores", "physical_cores", "usable_cores", "sockets", "numa_nodes"):
        count(f"cpu.{name}", getattr(cpu, name), 1)
    for name in ("total", "available", "swap_total"):
        count(f"memory.{name}", getattr(memory, name))
    if memory.cgroup_limit is not None:
        count("memory.cgroup_limit", memory.cgroup_limit, 1)
    bandwidth("memory.bandwidth", memory.bandwidth)
    for i, g in enumerate(gpus):
        count(f"gpus[{i}].index", g.index)
        count(f"gpus[{i}].vram_total", g.vram_total)
        count(f"gpus[{i}].vram_free", g.vram_free)
        cc: tuple[int, ...] = g.compute_capability
        if len(cc) != 2:
            problems.append(f"gpus[{i}].compute_capability must be [major, minor]")
        text(f"gpus[{i}].name", g.name)
        bandwidth(f"gpus[{i}].bandwidth", g.bandwidth)
    if disk is not None:
        count("disk.free", disk.free)
        count("disk.total", disk.total)
    if problems:
        raise HardwareError(
            f"The hardware description{' ' + source if source else ''} is malformed: "
            + "; ".join(problems),
            "Start from the output of `k3desk doctor --json` and edit the numbers.",
        )
