"""``k3desk doctor``: what this machine has, as k3desk sees it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.hardware import (
    HardwareProfile,
    check_cpu,
    cpu_check_lines,
    disk_warnings,
    fmt_bandwidth,
    fmt_read_rate,
)
from k3desk.core.app.values import K3Error, Progress, fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.services import Services


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor",
        help="show this machine's RAM, CPU, GPUs and free disk",
        description="Detect RAM (and container limits), CPU features, NVIDIA GPUs and free "
        "disk space, as used to recommend a quantization and plan a launch.",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the hardware profile as JSON (usable as a --hardware file)",
    )
    p.add_argument(
        "--disk",
        type=Path,
        metavar="PATH",
        help="folder to check free space at (default: the models folder)",
    )
    p.add_argument(
        "--no-benchmark",
        action="store_true",
        help="skip the short RAM bandwidth benchmark (the figure kept from an earlier one is "
        "shown, else an estimate from the CPU model) and the disk read measurement (up to "
        "256 MiB of the largest GGUF file in the folder)",
    )
    p.add_argument(
        "--remeasure",
        action="store_true",
        help="measure the RAM bandwidth again and keep the new figure (it is measured once "
        "per machine and kept, so that every view predicts the same speeds)",
    )
    p.add_argument(
        "--check-cpu",
        action="store_true",
        help="time the engine's own kernels on this CPU (about three minutes, 2.6 GB of the "
        "cache folder while it runs) so that speeds are predicted with this CPU's "
        "speed, not that of the machine the shipped costs were measured on",
    )
    p.add_argument(
        "--engine",
        metavar="PATH",
        help="with --check-cpu: the llama-server whose llama-bench to use "
        "(default: the one in Settings, else the one k3desk finds)",
    )
    p.set_defaults(handler=run)


def _progress(p: Progress) -> None:
    step = f" ({p.done}/{p.total})" if p.total else ""
    detail = f": {p.detail}" if p.detail else ""
    print(f"{p.stage}{step}{detail}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, services: Services) -> int:
    disk = args.disk if args.disk is not None else services.paths.models_dir
    if args.remeasure:
        if args.no_benchmark:
            raise K3Error("Give either --remeasure or --no-benchmark, not both.")
        services.measure_ram_again()
    profile = services.detect_hardware(disk, measure_bandwidth=not args.no_benchmark)
    if not args.no_benchmark:
        profile = services.with_measured_disk(profile)
    if args.check_cpu:
        check_cpu(services, engine=args.engine, on_progress=_progress)
    if args.json:
        print(profile.to_json())
    else:
        print(render(profile, cpu_check_lines(services, profile)))
    return 0


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def render(profile: HardwareProfile, kernels: list[str] | None = None) -> str:
    """The human-readable summary ``k3desk doctor`` prints (``kernels``: the lines on
    this CPU's kernel check, under CPU)."""
    cpu, mem = profile.cpu, profile.memory
    title = profile.label or profile.hostname or "this machine"
    lines = [f"k3desk doctor: {title}", ""]

    lines.append("Memory")
    swap = fmt_bytes(mem.swap_total) if mem.swap_total else "none"
    lines.append(
        f"  RAM        {fmt_bytes(mem.total)} total, {fmt_bytes(mem.available)} available, "
        f"swap {swap}"
    )
    if mem.cgroup_limit is not None:
        lines.append(
            f"  Limit      container (cgroup) limit {fmt_bytes(mem.cgroup_limit)}: "
            "a model may use no more than this"
        )
    else:
        lines.append("  Limit      no container memory limit")
    lines.append(f"  Bandwidth  {fmt_bandwidth(mem.bandwidth)}")
    if mem.bandwidth.note:
        lines.append(f"             {mem.bandwidth.note}")

    lines.append("")
    lines.append("CPU")
    sockets = f"{cpu.sockets} sockets" if cpu.sockets > 1 else "1 socket"
    numa = f", {cpu.numa_nodes} NUMA nodes" if cpu.numa_nodes > 1 else ""
    lines.append(f"  Model      {cpu.model}")
    lines.append(
        f"  Cores      {cpu.physical_cores} physical, {cpu.logical_cores} logical, "
        f"{cpu.usable_cores} usable by k3desk; {sockets}{numa}"
    )
    if cpu.flags & {"asimd", "sve", "i8mm", "dotprod"}:
        lines.append(
            f"  Features   NEON {_yes('asimd' in cpu.flags)}, dotprod "
            f"{_yes('dotprod' in cpu.flags)}, SVE {_yes('sve' in cpu.flags)}, "
            f"I8MM {_yes('i8mm' in cpu.flags)}"
        )
    else:
        lines.append(
            f"  Features   AVX2 {_yes(cpu.has_avx2)}, AVX-512 {_yes(cpu.has_avx512)}, "
            f"AMX {_yes(cpu.has_amx)}"
        )
    lines.extend(kernels or [])

    lines.append("")
    lines.append("GPUs")
    if not profile.gpus:
        lines.append(f"  none: {profile.gpu_note or 'no NVIDIA GPU found'}")
    for g in profile.gpus:
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
        if g.unified_memory:
            memory = f"unified memory (shares system RAM, {fmt_bytes(g.vram_free)} available)"
        else:
            memory = f"{fmt_bytes(g.vram_total)} VRAM, {fmt_bytes(g.vram_free)} free"
        lines.append(f"  GPU {g.index:<6} {g.name}")
        lines.append(f"             {memory}")
        lines.append(
            f"             compute capability {cc} (sm_{g.sm}), {g.architecture}, "
            f"{fmt_bandwidth(g.bandwidth)}"
        )
    if profile.gpus and profile.gpu_note:
        lines.append(f"  note: {profile.gpu_note}")
    if profile.driver_version:
        cuda = f", CUDA {profile.cuda_driver_version}" if profile.cuda_driver_version else ""
        lines.append(f"  Driver     {profile.driver_version}{cuda}")

    if profile.disk is not None:
        d = profile.disk
        lines.append("")
        lines.append("Disk")
        where = d.path if d.path == d.probed_path else f"{d.path} (measured at {d.probed_path})"
        fs = f", {d.filesystem}" if d.filesystem else ""
        lines.append(f"  {where}")
        lines.append(f"             {fmt_bytes(d.free)} free of {fmt_bytes(d.total)}{fs}")
        lines.append(f"  Read rate  {fmt_read_rate(d.read_rate)}")
        for w in disk_warnings(d):
            lines.append(f"  warning: {w}")
    return "\n".join(lines)
