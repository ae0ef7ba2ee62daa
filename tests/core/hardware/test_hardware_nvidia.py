"""NVIDIA detection through a fake NVML that raises pynvml's real error classes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from k3desk.core.hardware.detect import detect_hardware
from k3desk.core.hardware.nvidia import architecture_for, detect_nvidia
from k3desk.core.units import GiB, MiB
from tests.fixtures.hardware import FakeNvml, FakeSystem

RAM_TOTAL = 128 * GiB
RAM_FREE = 120 * GiB


def test_h200_is_hopper_not_blackwell(fake_nvml: Callable[..., FakeNvml]) -> None:
    nvml = fake_nvml("H200")
    found = detect_nvidia(nvml, ram_total=RAM_TOTAL, ram_available=RAM_FREE)
    assert found.note == ""
    (gpu,) = found.gpus
    assert gpu.name == "NVIDIA H200"
    assert gpu.compute_capability == (9, 0)
    assert gpu.architecture == "Hopper"
    assert gpu.sm == "90"
    assert gpu.vram_total == 143771 * MiB
    assert gpu.vram_free == 143181 * MiB
    assert not gpu.unified_memory
    assert gpu.bandwidth.source == "table"
    assert gpu.bandwidth.bytes_per_s == pytest.approx(4.8e12)
    assert found.driver_version == "570.133.20"
    assert found.cuda_driver_version == "12.8"
    # NVML is shut down again, once per init
    assert nvml.initialised == 0
    assert nvml.calls[0] == "nvmlInit"
    assert nvml.calls[-1] == "nvmlShutdown"


def test_rtx_5090_is_blackwell_sm120(fake_nvml: Callable[..., FakeNvml]) -> None:
    (gpu,) = detect_nvidia(fake_nvml("RTX5090")).gpus
    assert gpu.compute_capability == (12, 0)
    assert gpu.architecture == "Blackwell"
    assert gpu.sm == "120"
    assert gpu.vram_total == 32607 * MiB
    assert gpu.bandwidth.bytes_per_s == pytest.approx(1.792e12)


def test_gb10_memory_not_supported_means_unified_memory_budgeted_from_ram(
    fake_nvml: Callable[..., FakeNvml],
) -> None:
    found = detect_nvidia(fake_nvml("GB10"), ram_total=RAM_TOTAL, ram_available=RAM_FREE)
    (gpu,) = found.gpus
    assert gpu.unified_memory
    assert gpu.compute_capability == (12, 1)
    assert gpu.architecture == "Blackwell"
    assert gpu.vram_total == RAM_TOTAL
    assert gpu.vram_free == RAM_FREE
    assert gpu.bandwidth.bytes_per_s == pytest.approx(273e9)
    assert found.note == ""


def test_gb10_whole_profile_budgets_from_ram_and_counts_no_vram(
    fake_nvml: Callable[..., FakeNvml], fake_system: FakeSystem
) -> None:
    fake_system.meminfo(total_kb=125_000_000, available_kb=118_000_000)
    profile = detect_hardware(
        measure_bandwidth=False, root=fake_system.root, nvml=fake_nvml("GB10")
    )
    (gpu,) = profile.gpus
    assert gpu.vram_free == 118_000_000 * 1024
    assert profile.has_unified_memory
    assert profile.total_vram == 0  # unified memory is RAM, never counted twice


def test_no_driver_gives_an_empty_list_and_a_reason(fake_nvml: Callable[..., FakeNvml]) -> None:
    found = detect_nvidia(fake_nvml(init_error="LibraryNotFound"))
    assert found.gpus == ()
    assert "No NVIDIA driver found" in found.note
    assert "libnvidia-ml" in found.note


def test_driver_not_loaded_gives_a_different_reason(fake_nvml: Callable[..., FakeNvml]) -> None:
    found = detect_nvidia(fake_nvml(init_error="DriverNotLoaded"))
    assert found.gpus == ()
    assert "not loaded" in found.note
    assert "nvidia-smi" in found.note


def test_driver_with_zero_gpus_says_so(fake_nvml: Callable[..., FakeNvml]) -> None:
    found = detect_nvidia(fake_nvml())
    assert found.gpus == ()
    assert "reports no GPUs" in found.note
    assert found.driver_version == "570.133.20"


def test_mixed_rig_keeps_order_and_families(fake_nvml: Callable[..., FakeNvml]) -> None:
    found = detect_nvidia(fake_nvml("RTX4090", "RTX3090", "RTX3090", "RTX3090"))
    assert [g.index for g in found.gpus] == [0, 1, 2, 3]
    assert [g.architecture for g in found.gpus] == [
        "Ada Lovelace",
        "Ampere",
        "Ampere",
        "Ampere",
    ]
    total = sum(g.vram_total for g in found.gpus)
    assert total == (24564 + 3 * 24576) * MiB  # the "96 GB VRAM" rig


def test_a_gpu_that_fails_to_answer_is_left_out_with_a_note(
    fake_nvml: Callable[..., FakeNvml], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pynvml

    nvml = fake_nvml("H100", "H100")
    real_name = nvml.nvmlDeviceGetName

    def flaky_name(handle: object) -> str:
        if getattr(handle, "index", 0) == 1:
            raise pynvml.NVMLError_GpuIsLost()
        return real_name(handle)  # type: ignore[arg-type]

    monkeypatch.setattr(nvml, "nvmlDeviceGetName", flaky_name)
    found = detect_nvidia(nvml)
    assert [g.index for g in found.gpus] == [0]
    assert "GPU 1 could not be read" in found.note
    assert nvml.initialised == 0


def test_h100_pcie_and_sxm_differ_in_bandwidth(fake_nvml: Callable[..., FakeNvml]) -> None:
    sxm, pcie = detect_nvidia(fake_nvml("H100", "H100-PCIE")).gpus
    assert sxm.bandwidth.bytes_per_s == pytest.approx(3.35e12)
    assert pcie.bandwidth.bytes_per_s == pytest.approx(2.0e12)


@pytest.mark.parametrize(
    ("cc", "family"),
    [
        ((9, 0), "Hopper"),
        ((10, 0), "Blackwell"),
        ((10, 3), "Blackwell"),
        ((11, 0), "Blackwell"),
        ((12, 0), "Blackwell"),
        ((12, 1), "Blackwell"),
        ((8, 0), "Ampere"),
        ((8, 6), "Ampere"),
        ((8, 9), "Ada Lovelace"),
        ((7, 5), "Turing"),
    ],
)
def test_architecture_from_compute_capability(cc: tuple[int, int], family: str) -> None:
    assert architecture_for(cc) == family


def test_unknown_future_capability_is_named_not_guessed() -> None:
    assert "13.0" in architecture_for((13, 0))


def test_real_nvml_on_this_machine_never_crashes() -> None:
    found = detect_nvidia()
    if found.gpus:
        assert all(g.architecture and g.vram_total > 0 for g in found.gpus)
    else:
        assert found.note  # a reason a person can read
