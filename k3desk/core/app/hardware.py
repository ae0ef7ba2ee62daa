"""The machine as the shells show it: its profile, its disks, the memory bandwidth it
measured, the environment a launch on its GPUs gets, and what the tiers' verdicts mean."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.engines.discovery import SERVER_NAME, find_llama_server
from k3desk.core.errors import EngineError
from k3desk.core.hardware import detect as _detect
from k3desk.core.hardware.bandwidth import fmt_bandwidth
from k3desk.core.hardware.detect import disk_warnings
from k3desk.core.hardware.disk_rate import fmt_read_rate
from k3desk.core.hardware.nvidia import launch_env
from k3desk.core.hardware.profile import DiskInfo, HardwareProfile
from k3desk.core.planning.recommend import FITS, Recommendation
from k3desk.core.progress import CancelToken, ProgressCallback, no_progress
from k3desk.core.tuning.cpuprobe import CpuProbe, CpuProbeStore, run_cpu_probe

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

__all__ = [
    "FITS",
    "CpuProbe",
    "DiskInfo",
    "HardwareProfile",
    "Recommendation",
    "check_cpu",
    "cpu_check_lines",
    "cpu_check_summary",
    "detect_disk",
    "disk_warnings",
    "fmt_bandwidth",
    "fmt_read_rate",
    "launch_env",
]


def detect_disk(path: Path) -> DiskInfo:
    """The disk that holds ``path``: its free space, its kind and its speed class (see
    :func:`k3desk.core.hardware.detect.detect_disk`, looked up at each call)."""
    return _detect.detect_disk(path)


def check_cpu(
    services: Services,
    *,
    engine: str | Path | None = None,
    on_progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
) -> CpuProbe:
    """Time the engine's kernels on this machine and keep the result, so that every
    later plan here predicts with this CPU's own speed (``core/tuning/cpuprobe.py``).

    ``engine``: the llama-server (or its folder) whose ``llama-bench`` to use, and no
    other; without it, the one in Settings, else the one k3desk finds.  Raises
    EngineError (no engine, its tools missing, too little disk, a check already
    running) or Cancelled; keeps nothing then."""
    if engine is not None:
        server: Path | None = _given_server(Path(engine).expanduser())
    else:
        server = find_llama_server(services.paths, services.configured_engine())
    if server is None:
        raise EngineError(
            "No llama-server was found to time this CPU with.",
            hint="Install one with `k3desk engine install` or choose it in Settings.",
        )
    hw = services.detect_hardware(None, measure_bandwidth=True)
    work = services.paths.cache / "cpu-check"
    probe = run_cpu_probe(server, hw, work, progress=on_progress, cancel=cancel)
    CpuProbeStore(services.paths.state).put(probe)
    return probe


def _given_server(path: Path) -> Path:
    """The llama-server a person named (a folder: the one in it), checked to be there."""
    server = path / SERVER_NAME if path.is_dir() else path
    if not server.is_file():
        raise EngineError(
            f"There is no llama-server at {server}.",
            hint="Give the path of a llama-server (or of its folder), or leave --engine "
            "out to use the one in Settings or the one k3desk finds.",
        )
    return server


def cpu_check_lines(services: Services, hw: HardwareProfile) -> list[str]:
    """What ``doctor`` says of this CPU's kernel check: its figures, or how to make one."""
    probe = CpuProbeStore(services.paths.state).get(hw)
    if probe is None:
        return [
            "  Kernels    not timed here: speeds are predicted from costs measured on "
            "another machine",
            "             (`k3desk doctor --check-cpu` times this CPU's, about three minutes)",
        ]
    lines = [f"  Kernels    timed here on {probe.day}, against the machine the costs are from:"]
    for r in probe.runs:
        threads = f"{r.threads} thread{'s' if r.threads > 1 else ''}"
        lines.append(
            f"             {r.type_name:<5} {threads:<10} decoding {r.decode_tps:.1f} tok/s "
            f"({1 / r.decode_factor:.2f}x its speed), prompts {r.prompt_tps:.1f} tok/s "
            f"({1 / r.prompt_factor:.2f}x)"
        )
    return lines


def cpu_check_summary(services: Services, hw: HardwareProfile) -> str:
    """One line on this CPU's kernel check for the machine summary ("" for a hardware
    file: the check is of this machine)."""
    if hw.source != "detected":
        return ""
    probe = CpuProbeStore(services.paths.state).get(hw)
    if probe is None:
        return "not timed here: speeds are predicted from another machine's kernel costs"
    r = probe.general()
    threads = f"{r.threads} thread{'s' if r.threads > 1 else ''}"
    return (
        f"timed here on {probe.day}: decodes at {1 / r.decode_factor:.2f}x, prompts at "
        f"{1 / r.prompt_factor:.2f}x the speed of the machine the costs are from ({threads})"
    )
