"""Bandwidth figures: the GPU table, RAM estimates, the copy benchmark, overrides."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.errors import HardwareError
from k3desk.core.hardware.bandwidth import (
    estimate_ram_bandwidth,
    fill_missing_bandwidths,
    fmt_bandwidth,
    gpu_bandwidth_from_table,
    measure_ram_bandwidth,
    ram_bandwidth_from_channels,
    with_bandwidth_override,
)
from k3desk.core.hardware.profile import Bandwidth, HardwareProfile
from k3desk.core.units import MiB


@pytest.mark.parametrize(
    ("name", "tb_s"),
    [
        ("NVIDIA H100 80GB HBM3", 3.35),
        ("NVIDIA H100 PCIe", 2.0),
        ("NVIDIA H100 NVL", 3.9),
        ("NVIDIA H200", 4.8),
        ("NVIDIA H200 NVL", 4.8),
        ("NVIDIA A100-SXM4-80GB", 2.039),
        ("NVIDIA A100 80GB PCIe", 1.935),
        ("NVIDIA A100-SXM4-40GB", 1.555),
        ("NVIDIA B200", 8.0),
        ("NVIDIA B300 SXM6 AC", 8.0),
        ("NVIDIA GeForce RTX 5090", 1.792),
        ("NVIDIA GeForce RTX 4090", 1.008),
        ("NVIDIA GeForce RTX 3090", 0.936),
        ("NVIDIA GeForce RTX 3090 Ti", 1.008),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 1.792),
        ("NVIDIA GB10", 0.273),
        ("NVIDIA L40S", 0.864),
        ("NVIDIA L4", 0.300),
    ],
)
def test_gpu_table(name: str, tb_s: float) -> None:
    bw = gpu_bandwidth_from_table(name)
    assert bw.source == "table"
    assert bw.bytes_per_s == pytest.approx(tb_s * 1e12)


def test_unknown_gpu_is_unknown_not_guessed() -> None:
    bw = gpu_bandwidth_from_table("NVIDIA Quadro Mystery 9000")
    assert (bw.bytes_per_s, bw.source) == (0.0, "unknown")
    assert fmt_bandwidth(bw) == "unknown"


def test_ram_estimate_from_channels_and_speed() -> None:
    bw = ram_bandwidth_from_channels(12, 4800)
    assert bw.bytes_per_s == pytest.approx(460.8e9)
    assert bw.source == "estimate"
    assert "12 channels x 4800 MT/s x 8 B = 460.8 GB/s" in bw.note
    assert ram_bandwidth_from_channels(8, 4800, sockets=2).bytes_per_s == pytest.approx(614.4e9)


@pytest.mark.parametrize(
    ("description", "sockets", "gb_s"),
    [
        ("12ch DDR5-4800", 1, 460.8),
        ("8-channel DDR4-3200", 1, 204.8),
        ("8 channels DDR5 5600", 2, 716.8),
        ("AMD EPYC 9554P 64-Core Processor", 1, 460.8),
        ("AMD EPYC 7742 64-Core Processor", 2, 409.6),
        ("Intel(R) Xeon(R) Platinum 8480+", 1, 307.2),
        ("AMD Ryzen 9 9950X 16-Core Processor", 1, 89.6),
    ],
)
def test_ram_estimate_from_a_description(description: str, sockets: int, gb_s: float) -> None:
    bw = estimate_ram_bandwidth(description, sockets)
    assert bw.source == "estimate"
    assert bw.bytes_per_s == pytest.approx(gb_s * 1e9)


def test_unknown_platform_says_what_it_assumed() -> None:
    bw = estimate_ram_bandwidth("AMD EPYC")
    assert bw.bytes_per_s == pytest.approx(51.2e9)
    assert "assumed dual-channel DDR4-3200" in bw.note


def test_bad_channel_numbers_are_rejected() -> None:
    with pytest.raises(HardwareError, match="0 channels"):
        ram_bandwidth_from_channels(0, 4800)


def test_copy_benchmark_is_quick_and_plausible() -> None:
    t0 = time.perf_counter()
    bw = measure_ram_bandwidth(buffer_bytes=64 * MiB, threads=2, repeats=3)
    elapsed = time.perf_counter() - t0
    assert bw.source == "measured"
    # Any machine that can run k3desk copies RAM faster than 1 GB/s and slower than 10 TB/s.
    assert 1e9 < bw.bytes_per_s < 1e13
    assert "64 MiB" in bw.note
    assert "2 thread" in bw.note
    assert elapsed < 5.0


def test_copy_benchmark_counts_read_and_write_traffic() -> None:
    ticks = iter([0.0, 0.5, 1.0, 1.25])  # two runs: 0.5 s, then 0.25 s (the best)
    bw = measure_ram_bandwidth(buffer_bytes=4 * MiB, repeats=2, clock=lambda: next(ticks))
    assert bw.bytes_per_s == pytest.approx(2 * 4 * MiB / 0.25)


def test_benchmark_refuses_nonsense_sizes() -> None:
    with pytest.raises(HardwareError, match="--no-benchmark"):
        measure_ram_bandwidth(buffer_bytes=10)


def test_overrides_replace_and_are_labelled(hardware_file: Callable[[str], Path]) -> None:
    profile = HardwareProfile.from_json_file(hardware_file("512GB-ddr5-96GB-vram"))
    changed = with_bandwidth_override(profile, ram_gb_s=250, gpu_gb_s={2: 900})
    assert changed.memory.bandwidth == Bandwidth(250e9, "override", "set by the user: 250 GB/s")
    assert changed.gpus[2].bandwidth.source == "override"
    assert changed.gpus[1].bandwidth == profile.gpus[1].bandwidth
    with pytest.raises(HardwareError, match="no GPU 7"):
        with_bandwidth_override(profile, gpu_gb_s={7: 900})
    with pytest.raises(HardwareError, match="positive"):
        with_bandwidth_override(profile, ram_gb_s=-3)


def test_fill_missing_keeps_the_files_numbers(hardware_file: Callable[[str], Path]) -> None:
    profile = HardwareProfile.from_json_file(hardware_file("8xH100-2TB"))
    assert fill_missing_bandwidths(profile) == profile
    unknown = Bandwidth(0.0, "unknown")
    stripped = replace(
        profile,
        memory=replace(profile.memory, bandwidth=unknown),
        gpus=tuple(replace(g, bandwidth=unknown) for g in profile.gpus),
    )
    filled = fill_missing_bandwidths(stripped)
    assert all(g.bandwidth.bytes_per_s == pytest.approx(3.35e12) for g in filled.gpus)
    assert filled.memory.bandwidth.source == "estimate"
    assert filled.memory.bandwidth.bytes_per_s == pytest.approx(614.4e9)  # 2x 8ch DDR5-4800


def test_fmt_bandwidth() -> None:
    assert fmt_bandwidth(Bandwidth(3.35e12, "table")) == "3.35 TB/s (table)"
    assert fmt_bandwidth(Bandwidth(70.8e9, "measured")) == "70.8 GB/s (measured)"
