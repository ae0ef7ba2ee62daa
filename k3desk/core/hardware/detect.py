"""Detect this machine: RAM, container limits, CPU, disk, GPUs -> one HardwareProfile.

Every reader takes the file-system root (``root``), so tests can point it at a
folder of fake ``/proc`` and ``/sys`` files; psutil is used only where no such
file exists (non-Linux systems) and for free disk space.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from k3desk.core.errors import HardwareError
from k3desk.core.hardware.bandwidth import (
    benchmark_threads,
    estimate_ram_bandwidth,
    measure_ram_bandwidth,
)
from k3desk.core.hardware.disk_rate import table_read_rate
from k3desk.core.hardware.nvidia import detect_nvidia
from k3desk.core.hardware.profile import CpuInfo, DiskInfo, HardwareProfile, MemoryInfo
from k3desk.core.hardware.ram_rate import benchmark_bytes

REAL_ROOT = Path("/")

# /proc/cpuinfo flags that matter for llama.cpp's CPU back-end (x86 and arm64).
X86_FLAGS = frozenset(
    {
        "sse3",
        "ssse3",
        "sse4_1",
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi2",
        "avx_vnni",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
        "amx_fp16",
    }
)
ARM_FLAGS = frozenset(
    {"asimd", "asimdhp", "asimddp", "fphp", "sve", "sve2", "i8mm", "svei8mm", "bf16", "sme"}
)

# /proc/cpuinfo on arm64 names no model: map (implementer, part) to a core name.
_ARM_PARTS: dict[tuple[int, int], str] = {
    (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD40): "Neoverse-V1",
    (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD83): "Neoverse-V3AE",
    (0x41, 0xD84): "Neoverse-V3",
    (0x41, 0xD85): "Cortex-X925",
    (0x41, 0xD87): "Cortex-A725",
    (0x41, 0xD8E): "Neoverse-N3",
    (0x41, 0xD0B): "Cortex-A76",
    (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD42): "Cortex-A78AE",
    (0x61, 0x000): "Apple",
}

# Values this large mean "no limit" (cgroup v1 writes PAGE_COUNTER_MAX * page size).
_UNLIMITED = 1 << 60


# ------------------------------------------------------------------ small readers


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _under(root: Path, absolute: str) -> Path:
    return root / absolute.lstrip("/")


def read_meminfo(root: Path = REAL_ROOT) -> dict[str, int]:
    """/proc/meminfo as a dict of bytes (``kB`` values multiplied out)."""
    text = _read(root / "proc" / "meminfo")
    out: dict[str, int] = {}
    if not text:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        value = int(parts[0])
        if len(parts) > 1 and parts[1].lower() == "kb":
            value *= 1024
        out[key.strip()] = value
    return out


# ------------------------------------------------------------------ cgroups


@dataclass(frozen=True)
class CgroupMount:
    version: int  # 1 or 2
    mountpoint: str
    controllers: frozenset[str]  # v1: the mount's controllers; v2: empty (all)


def read_mounts(root: Path = REAL_ROOT) -> list[tuple[str, str, str, list[str]]]:
    """(device, mountpoint, fstype, options) per line of /proc/mounts, octal escapes decoded."""
    text = _read(root / "proc" / "mounts") or ""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        device, mountpoint, fstype, opts = (_unescape(p) for p in parts[:4])
        out.append((device, mountpoint, fstype, opts.split(",")))
    return out


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _cgroup_mounts(root: Path) -> list[CgroupMount]:
    mounts = []
    for _dev, mountpoint, fstype, opts in read_mounts(root):
        if fstype == "cgroup2":
            mounts.append(CgroupMount(2, mountpoint, frozenset()))
        elif fstype == "cgroup":
            mounts.append(CgroupMount(1, mountpoint, frozenset(opts)))
    if not mounts:  # no /proc/mounts (or a minimal fake): the usual places
        if (root / "sys/fs/cgroup/cgroup.controllers").exists():
            mounts.append(CgroupMount(2, "/sys/fs/cgroup", frozenset()))
        for name, ctrls in (("memory", {"memory"}), ("cpu", {"cpu"}), ("cpu,cpuacct", {"cpu"})):
            if (root / "sys/fs/cgroup" / name).is_dir():
                mounts.append(CgroupMount(1, f"/sys/fs/cgroup/{name}", frozenset(ctrls)))
    return mounts


def _self_cgroups(root: Path) -> dict[str, str]:
    """Controller -> cgroup path from /proc/self/cgroup; key "" is the v2 hierarchy."""
    text = _read(root / "proc" / "self" / "cgroup") or ""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, ctrls, path = parts
        if not ctrls:
            out[""] = path
        for c in ctrls.split(","):
            if c:
                out[c] = path
    return out


def _cgroup_dirs(root: Path, mountpoint: str, cg_path: str) -> list[Path]:
    """The process's cgroup folder and its ancestors up to the mount, deepest first.

    Inside a container with its own cgroup namespace the mount *is* the
    process's cgroup, and the path from /proc/self/cgroup may not exist under
    it; then only the mount folder is read.
    """
    base = _under(root, mountpoint)
    dirs: list[Path] = []
    rel = [p for p in cg_path.strip("/").split("/") if p and p != ".."]
    while rel:
        d = base.joinpath(*rel)
        if d.is_dir():
            dirs.append(d)
        rel.pop()
    dirs.append(base)
    return dirs


def _parse_limit(text: str | None) -> int | None:
    if text is None:
        return None
    value = text.strip()
    if not value or value == "max":
        return None
    try:
        n = int(value)
    except ValueError:
        return None
    if n <= 0 or n >= _UNLIMITED:
        return None
    return n


def cgroup_memory_limit(root: Path = REAL_ROOT) -> int | None:
    """The tightest memory limit on this process's cgroup and its ancestors (None: unlimited).

    cgroup v2: ``memory.max`` ("max" = unlimited); v1: ``memory.limit_in_bytes``.
    """
    own = _self_cgroups(root)
    limits: list[int] = []
    for m in _cgroup_mounts(root):
        if m.version == 2:
            files = [d / "memory.max" for d in _cgroup_dirs(root, m.mountpoint, own.get("", "/"))]
        elif "memory" in m.controllers:
            files = [
                d / "memory.limit_in_bytes"
                for d in _cgroup_dirs(root, m.mountpoint, own.get("memory", "/"))
            ]
        else:
            continue
        for f in files:
            limit = _parse_limit(_read(f))
            if limit is not None:
                limits.append(limit)
    return min(limits) if limits else None


def cgroup_cpu_limit(root: Path = REAL_ROOT) -> float | None:
    """CPUs allowed by the cgroup quota (``cpu.max`` or ``cpu.cfs_quota_us``), None = no quota."""
    own = _self_cgroups(root)
    limits: list[float] = []
    for m in _cgroup_mounts(root):
        if m.version == 2:
            for d in _cgroup_dirs(root, m.mountpoint, own.get("", "/")):
                text = _read(d / "cpu.max")
                if text is None:
                    continue
                parts = text.split()
                if len(parts) >= 1 and parts[0] != "max":
                    period = parts[1] if len(parts) > 1 else "100000"
                    q = _quota(parts[0], period)
                    if q is not None:
                        limits.append(q)
        elif "cpu" in m.controllers:
            for d in _cgroup_dirs(root, m.mountpoint, own.get("cpu", "/")):
                quota_text = _read(d / "cpu.cfs_quota_us")
                period_text = _read(d / "cpu.cfs_period_us")
                if quota_text is not None and period_text is not None:
                    q = _quota(quota_text.strip(), period_text.strip())
                    if q is not None:
                        limits.append(q)
    return min(limits) if limits else None


def _quota(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    if q <= 0 or p <= 0:
        return None
    return q / p


# ------------------------------------------------------------------ memory


def detect_memory(root: Path = REAL_ROOT) -> MemoryInfo:
    """RAM and swap from /proc/meminfo (psutil where there is none), plus the cgroup limit."""
    info = read_meminfo(root)
    if "MemTotal" in info:
        total = info["MemTotal"]
        available = info.get("MemAvailable", info.get("MemFree", 0))
        swap = info.get("SwapTotal", 0)
    else:
        vm = psutil.virtual_memory()
        total, available = int(vm.total), int(vm.available)
        swap = int(psutil.swap_memory().total)
    limit = cgroup_memory_limit(root)
    if limit is not None and limit >= total:
        limit = None  # a limit above the RAM there is changes nothing
    return MemoryInfo(total=total, available=available, swap_total=swap, cgroup_limit=limit)


# ------------------------------------------------------------------ CPU


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            cur[key.strip().lower()] = value.strip()
    if cur:
        blocks.append(cur)
    return blocks


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip(), 0)
    except ValueError:
        return None


def _arm_model(procs: list[dict[str, str]], root: Path) -> str:
    cores: dict[str, int] = {}
    for b in procs:
        impl, part = _int(b.get("cpu implementer")), _int(b.get("cpu part"))
        if impl is None or part is None:
            continue
        name = _ARM_PARTS.get((impl, part), f"Arm core {impl:#x}:{part:#x}")
        cores[name] = cores.get(name, 0) + 1
    machine = (_read(root / "proc/device-tree/model") or "").strip("\x00 \n")
    core_text = " + ".join(f"{n}x {name}" for name, n in cores.items())
    if machine and core_text:
        return f"{machine} ({core_text})"
    return machine or core_text


def _topology(root: Path, logical: int) -> tuple[int, int] | None:
    """(physical cores, sockets) from /sys/devices/system/cpu/cpu*/topology."""
    base = root / "sys/devices/system/cpu"
    if not base.is_dir():
        return None
    cores: set[tuple[int, int]] = set()
    packages: set[int] = set()
    for d in base.glob("cpu[0-9]*"):
        pkg = _int(_read(d / "topology/physical_package_id"))
        core = _int(_read(d / "topology/core_id"))
        if pkg is None or core is None:
            continue
        packages.add(pkg)
        cores.add((pkg, core))
    if not cores or len(cores) > logical:
        return None
    return len(cores), max(1, len(packages))


def _numa_nodes(root: Path) -> int:
    count = 0
    for d in (root / "sys/devices/system/node").glob("node[0-9]*"):
        m = re.search(r"MemTotal:\s+(\d+)", _read(d / "meminfo") or "MemTotal: 1")
        if m and int(m[1]) > 0:  # nodes without memory (CPU-only, CXL) do not count
            count += 1
    return max(1, count)


def detect_cpu(
    root: Path = REAL_ROOT,
    affinity: Callable[[], set[int]] | None = None,
) -> CpuInfo:
    """CPU model, core counts (after affinity and cgroup quota), sockets and llama.cpp flags."""
    text = _read(root / "proc" / "cpuinfo") or ""
    blocks = _cpuinfo_blocks(text)
    procs = [b for b in blocks if "processor" in b]
    logical = len(procs) or (psutil.cpu_count(logical=True) if root == REAL_ROOT else 0) or 1

    raw_flags: set[str] = set()
    for b in procs[:1] or blocks[:1]:
        raw_flags |= set(b.get("flags", "").split()) | set(b.get("features", "").split())
    flags = {f for f in raw_flags if f in X86_FLAGS or f in ARM_FLAGS or f.startswith("avx512")}
    if "pni" in raw_flags:
        flags.add("sse3")  # x86 /proc/cpuinfo spells SSE3 'pni'
    if "asimddp" in raw_flags:
        flags.add("dotprod")  # arm64 /proc/cpuinfo spells the dot-product feature 'asimddp'

    model = next((b["model name"] for b in procs if b.get("model name")), "")
    if not model:
        model = next((b[k] for b in blocks for k in ("hardware", "model name") if b.get(k)), "")
    if not model and any("cpu implementer" in b for b in procs):
        model = _arm_model(procs, root)
    if not model:
        import platform

        model = platform.processor() or platform.machine() or "unknown CPU"

    topo = _topology(root, logical)
    if topo is None:
        pairs = {(b.get("physical id", "0"), b["core id"]) for b in procs if "core id" in b}
        sockets = len({b["physical id"] for b in procs if "physical id" in b}) or 1
        if pairs:
            physical = len(pairs)
        elif root == REAL_ROOT:
            physical = psutil.cpu_count(logical=False) or logical
        else:
            physical = logical
        topo = (physical, sockets)
    physical, sockets = topo

    if affinity is None:
        affinity = _default_affinity if root == REAL_ROOT else (lambda: set(range(logical)))
    usable = len(affinity()) or logical
    quota = cgroup_cpu_limit(root)
    if quota is not None:
        usable = max(1, min(usable, math.ceil(quota)))
    return CpuInfo(
        model=" ".join(model.split()),
        logical_cores=logical,
        physical_cores=max(1, physical),
        usable_cores=max(1, usable),
        flags=frozenset(flags),
        sockets=sockets,
        numa_nodes=_numa_nodes(root),
    )


def _default_affinity() -> set[int]:
    getter = getattr(os, "sched_getaffinity", None)
    if getter is not None:
        return set(getter(0))
    return set(range(os.cpu_count() or 1))


# ------------------------------------------------------------------ disk


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest parent that exists (a models folder may not exist yet)."""
    p = path.expanduser().absolute()
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def filesystem_type(path: Path, root: Path = REAL_ROOT) -> str:
    """The fstype of the mount holding ``path`` (longest matching mount point)."""
    best, fstype = -1, ""
    target = str(path)
    for _dev, mountpoint, fs, _opts in read_mounts(root):
        mp = mountpoint.rstrip("/") or "/"
        inside = target == mp or target.startswith(mp + "/") or mp == "/"
        if inside and len(mp) >= best:
            best, fstype = len(mp), fs
    return fstype


def detect_disk(path: Path, root: Path = REAL_ROOT) -> DiskInfo:
    probed = nearest_existing(path)
    try:
        real = probed.resolve()
        usage = psutil.disk_usage(str(real))
    except OSError as exc:
        raise HardwareError(
            f"Cannot read free space at {probed} (for {path}): {exc.strerror or exc}",
            "Choose a folder on a mounted, readable disk.",
        ) from exc
    fs = filesystem_type(real, root)
    return DiskInfo(
        path=str(path.expanduser().absolute()),
        probed_path=str(probed),
        free=int(usage.free),
        total=int(usage.total),
        filesystem=fs,
        read_rate=table_read_rate(real, fs, root),
    )


FAT_FILESYSTEMS = frozenset({"vfat", "msdos", "fat", "exfat_fuse_fat32"})


def disk_warnings(disk: DiskInfo, largest_file: int = 0) -> list[str]:
    """Problems with a download folder a person should hear about before a 300 GB download."""
    out: list[str] = []
    if disk.filesystem in FAT_FILESYSTEMS:
        out.append(
            f"{disk.probed_path} is on a {disk.filesystem} file system, which cannot hold "
            f"files over 4 GiB; GGUF shards are up to about 50 GB. Use an ext4, xfs, "
            f"btrfs, NTFS or exFAT disk."
        )
    if largest_file and disk.free < largest_file:
        out.append(f"{disk.probed_path} has less free space than the largest file needs.")
    if disk.filesystem in ("tmpfs", "ramfs"):
        out.append(
            f"{disk.probed_path} is on {disk.filesystem} (held in RAM): a model stored there "
            f"uses the RAM it needs to run."
        )
    return out


# ------------------------------------------------------------------ everything


def detect_hardware(
    disk_path: Path | None = None,
    *,
    measure_bandwidth: bool = True,
    root: Path = REAL_ROOT,
    nvml: Any = None,
    affinity: Callable[[], set[int]] | None = None,
) -> HardwareProfile:
    """Describe this machine.

    ``root`` and ``nvml`` (a pynvml-like module) are for tests; ``measure_bandwidth``
    runs the short RAM copy benchmark (otherwise RAM bandwidth is estimated
    from the CPU model and says so).
    """
    memory = detect_memory(root)
    cpu = detect_cpu(root, affinity)
    ram_for_gpu = min(memory.available, memory.usable_total)
    nv = detect_nvidia(nvml, ram_total=memory.usable_total, ram_available=ram_for_gpu)

    if measure_bandwidth:
        ram_bw = measure_ram_bandwidth(
            buffer_bytes=benchmark_bytes(memory.available),
            threads=benchmark_threads(cpu.usable_cores),
        )
    else:
        ram_bw = estimate_ram_bandwidth(cpu.model, cpu.sockets)
    memory = replace(memory, bandwidth=ram_bw)
    gpus = tuple(
        replace(g, bandwidth=replace(ram_bw, note="unified memory: " + ram_bw.note))
        if g.unified_memory and g.bandwidth.source == "unknown"
        else g
        for g in nv.gpus
    )
    disk = detect_disk(disk_path, root) if disk_path is not None else None
    return HardwareProfile(
        cpu=cpu,
        memory=memory,
        gpus=gpus,
        gpu_note=nv.note,
        driver_version=nv.driver_version,
        cuda_driver_version=nv.cuda_driver_version,
        disk=disk,
        hostname=socket.gethostname() if root == REAL_ROOT else "",
        source="detected",
    )
