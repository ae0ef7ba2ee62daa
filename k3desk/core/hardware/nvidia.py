"""NVIDIA GPUs through NVML (``import pynvml``, from the nvidia-ml-py package).

Missing library, driver not loaded or no GPU give an empty list and a reason a
person can act on, never an exception.  The NVML module is a parameter so tests
can drive this exact code with a fake that raises pynvml's own error classes.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k3desk.core.hardware.bandwidth import gpu_bandwidth_from_table
from k3desk.core.hardware.profile import GpuInfo

# NVML (and so the hardware profile, the plan's CUDA<i> names and its -ts split) numbers
# GPUs in PCI bus order; the CUDA runtime numbers them fastest first unless
# CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA C Programming Guide, "CUDA Environment Variables").
# In a mixed machine (one 4090 + three 3090) the two orders differ, so every engine
# k3desk starts, here or on another node, gets this.
CUDA_ORDER_ENV: dict[str, str] = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def launch_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables k3desk sets for an engine it starts: the GPU order, then ``extra``."""
    return {**CUDA_ORDER_ENV, **(extra or {})}


# Compute capability -> (architecture family, which chips)
_CC_TABLE: dict[tuple[int, int], tuple[str, str]] = {
    (3, 0): ("Kepler", "GTX 600/700"),
    (3, 5): ("Kepler", "K20/K40"),
    (3, 7): ("Kepler", "K80"),
    (5, 0): ("Maxwell", "GTX 750"),
    (5, 2): ("Maxwell", "GTX 900, M40"),
    (5, 3): ("Maxwell", "Jetson Nano"),
    (6, 0): ("Pascal", "P100"),
    (6, 1): ("Pascal", "GTX 10xx, P40"),
    (6, 2): ("Pascal", "Jetson TX2"),
    (7, 0): ("Volta", "V100"),
    (7, 2): ("Volta", "Jetson Xavier"),
    (7, 5): ("Turing", "RTX 20xx, T4"),
    (8, 0): ("Ampere", "A100, A800, A30"),
    (8, 6): ("Ampere", "RTX 30xx, A40, A10, RTX A6000"),
    (8, 7): ("Ampere", "Jetson Orin"),
    (8, 9): ("Ada Lovelace", "RTX 40xx, L40S, L4, RTX 6000 Ada"),
    (9, 0): ("Hopper", "H100, H200, H800, H20, GH200"),
    (10, 0): ("Blackwell", "B200, GB200"),
    (10, 3): ("Blackwell", "Blackwell Ultra: B300, GB300"),
    (11, 0): ("Blackwell", "Jetson Thor"),
    (12, 0): ("Blackwell", "RTX 50xx, RTX PRO 6000 Blackwell"),
    (12, 1): ("Blackwell", "GB10, DGX Spark"),
}
_FAMILY_BY_MAJOR = {
    3: "Kepler",
    5: "Maxwell",
    6: "Pascal",
    7: "Volta",
    8: "Ampere",
    9: "Hopper",
    10: "Blackwell",
    11: "Blackwell",
    12: "Blackwell",
}
# Integrated GPUs whose memory is the system RAM.
_UNIFIED_CC = frozenset({(5, 3), (6, 2), (7, 2), (8, 7), (11, 0), (12, 1)})


def architecture_for(cc: tuple[int, int]) -> str:
    """The architecture family for a compute capability: (9, 0) -> 'Hopper'."""
    if cc in _CC_TABLE:
        return _CC_TABLE[cc][0]
    return _FAMILY_BY_MAJOR.get(cc[0], f"unknown (compute capability {cc[0]}.{cc[1]})")


def is_unified_cc(cc: tuple[int, int]) -> bool:
    return cc in _UNIFIED_CC


@dataclass(frozen=True)
class NvidiaDetection:
    gpus: tuple[GpuInfo, ...]
    note: str = ""  # why there are no GPUs, or what went wrong with some
    driver_version: str = ""
    cuda_driver_version: str = ""


def _cuda_version(raw: object) -> str:
    """NVML reports CUDA 12.8 as 12080."""
    if isinstance(raw, int) and raw > 0:
        return f"{raw // 1000}.{(raw % 1000) // 10}"
    return ""


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _init_failure_note(nvml: Any, exc: BaseException) -> str:
    def is_(name: str) -> bool:
        cls = getattr(nvml, name, None)
        return isinstance(cls, type) and isinstance(exc, cls)

    if is_("NVMLError_LibraryNotFound"):
        if sys.platform == "darwin":
            return "No NVIDIA GPU support on macOS; running on the CPU."
        return (
            "No NVIDIA driver found (the NVML library, libnvidia-ml.so.1 / nvml.dll, "
            "could not be loaded); running on the CPU only. Install the NVIDIA driver "
            "if this machine has an NVIDIA GPU."
        )
    if is_("NVMLError_DriverNotLoaded"):
        return (
            "The NVIDIA driver is installed but not loaded, so no GPU can be used. "
            "Check `nvidia-smi`; after a driver update a reboot usually fixes this."
        )
    if is_("NVMLError_NoPermission"):
        return "No permission to query the NVIDIA driver (check access to /dev/nvidia*)."
    if is_("NVMLError_LibRmVersionMismatch"):
        return (
            "The NVIDIA driver library and kernel module versions differ (often right "
            "after a driver update); reboot to use the GPUs."
        )
    return f"The NVIDIA driver could not be queried: {exc}"


def detect_nvidia(
    nvml: Any = None,
    *,
    ram_total: int = 0,
    ram_available: int = 0,
) -> NvidiaDetection:
    """Every NVIDIA GPU NVML sees.

    ``nvml`` defaults to the real ``pynvml``.  For unified-memory devices (GB10,
    Thor, Jetson) the memory figures come from ``ram_total``/``ram_available``.
    """
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return NvidiaDetection(
                (), "The nvidia-ml-py package is not installed, so NVIDIA GPUs cannot be seen."
            )
        nvml = pynvml
    base_error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except base_error as exc:
        return NvidiaDetection((), _init_failure_note(nvml, exc))
    except OSError as exc:  # a broken library file
        return NvidiaDetection((), f"The NVIDIA driver library could not be loaded: {exc}")
    try:
        return _query(nvml, base_error, ram_total, ram_available)
    finally:
        with contextlib.suppress(base_error):
            nvml.nvmlShutdown()


def _query(
    nvml: Any, base_error: type[BaseException], ram_total: int, ram_free: int
) -> NvidiaDetection:
    not_supported: type[BaseException] | None = getattr(nvml, "NVMLError_NotSupported", None)
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except base_error:
        driver = ""
    try:
        cuda = _cuda_version(nvml.nvmlSystemGetCudaDriverVersion())
    except base_error:
        cuda = ""
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except base_error as exc:
        return NvidiaDetection((), f"The NVIDIA driver could not count GPUs: {exc}", driver, cuda)

    gpus: list[GpuInfo] = []
    problems: list[str] = []
    for i in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(nvml.nvmlDeviceGetName(handle))
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            cc = (int(major), int(minor))
        except base_error as exc:
            problems.append(f"GPU {i} could not be read ({exc}); it is left out.")
            continue
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except base_error:
            uuid = ""
        unified = is_unified_cc(cc)
        total = free = 0
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            total, free = int(mem.total), int(mem.free)
        except base_error as exc:
            if not_supported is not None and isinstance(exc, not_supported):
                unified = True  # GB10 reports no separate memory: it shares system RAM
            else:
                problems.append(f"GPU {i} ({name}) did not report its memory ({exc}).")
        if unified:
            total, free = ram_total, ram_free
        gpus.append(
            GpuInfo(
                index=i,
                name=name,
                vram_total=total,
                vram_free=free,
                compute_capability=cc,
                architecture=architecture_for(cc),
                unified_memory=unified,
                bandwidth=gpu_bandwidth_from_table(name),
                uuid=uuid,
            )
        )
    note = " ".join(problems)
    if count == 0:
        note = f"The NVIDIA driver {driver or ''} is loaded but reports no GPUs.".replace("  ", " ")
    return NvidiaDetection(tuple(gpus), note, driver, cuda)
