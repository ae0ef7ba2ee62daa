"""RAM, cgroup limits, CPU and disk detection, from this machine and from fake /proc and /sys."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from k3desk.core.errors import HardwareError
from k3desk.core.hardware.detect import (
    cgroup_cpu_limit,
    cgroup_memory_limit,
    detect_cpu,
    detect_disk,
    detect_hardware,
    detect_memory,
    disk_warnings,
    read_meminfo,
)
from k3desk.core.units import GiB
from tests.fixtures.hardware import FakeSystem

SPR_FLAGS = (
    "fpu vme sse sse2 ht pni ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2 avx512f avx512dq "
    "avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni avx512_fp16 avx_vnni amx_bf16 amx_tile "
    "amx_int8 hypervisor"
)
ARM_FEATURES = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt "
    "fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb "
    "paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm "
    "svebf16 i8mm bf16 dgh bti"
)


def _gb10_cpuinfo() -> str:
    blocks = []
    for i in range(20):
        part = "0xd85" if i < 10 else "0xd87"
        blocks.append(
            f"processor\t: {i}\nBogoMIPS\t: 2000.00\nFeatures\t: {ARM_FEATURES}\n"
            f"CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n"
            f"CPU part\t: {part}\nCPU revision\t: 1\n"
        )
    return "\n".join(blocks)


# ---------------------------------------------------------------- this machine


def test_memory_matches_proc_meminfo_and_psutil() -> None:
    mem = detect_memory()
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        total_kb = next(
            int(line.split()[1])
            for line in meminfo.read_text().splitlines()
            if line.startswith("MemTotal:")
        )
        assert mem.total == total_kb * 1024
    assert mem.total == psutil.virtual_memory().total
    assert 0 < mem.available <= mem.total
    assert mem.usable_total <= mem.total


def test_cpu_on_this_machine_agrees_with_proc_cpuinfo() -> None:
    cpu = detect_cpu()
    assert cpu.logical_cores == (os.cpu_count() or 1)
    assert 1 <= cpu.usable_cores <= cpu.logical_cores
    assert 1 <= cpu.physical_cores <= cpu.logical_cores
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags_line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    advertised = set(flags_line.partition(":")[2].split())
    for flag in ("avx2", "avx512f", "amx_tile", "amx_int8", "fma", "f16c"):
        assert (flag in cpu.flags) == (flag in advertised), flag


# ---------------------------------------------------------------- memory and cgroups


def test_meminfo_is_read_in_bytes(fake_system: FakeSystem) -> None:
    fake_system.meminfo(total_kb=32_000_000, available_kb=20_000_000, swap_kb=8_000_000)
    info = read_meminfo(fake_system.root)
    assert info["MemTotal"] == 32_000_000 * 1024
    mem = detect_memory(fake_system.root)
    assert (mem.total, mem.available, mem.swap_total) == (
        32_000_000 * 1024,
        20_000_000 * 1024,
        8_000_000 * 1024,
    )
    assert mem.cgroup_limit is None


def test_cgroup_v2_limit_takes_the_tightest_ancestor(fake_system: FakeSystem) -> None:
    fake_system.meminfo(total_kb=64 * 1024 * 1024, available_kb=60 * 1024 * 1024)
    fake_system.write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n")
    fake_system.write("proc/self/cgroup", "0::/user.slice/k3desk.scope\n")
    fake_system.write("sys/fs/cgroup/cgroup.controllers", "cpu memory\n")
    fake_system.write("sys/fs/cgroup/user.slice/k3desk.scope/memory.max", f"{32 * GiB}\n")
    fake_system.write("sys/fs/cgroup/memory.max", "max\n")
    fake_system.write("sys/fs/cgroup/user.slice/memory.max", f"{16 * GiB}\n")
    assert cgroup_memory_limit(fake_system.root) == 16 * GiB
    mem = detect_memory(fake_system.root)
    assert mem.cgroup_limit == 16 * GiB
    assert mem.usable_total == 16 * GiB  # a model may not use the other 48 GiB


def test_cgroup_v2_max_means_unlimited(fake_system: FakeSystem) -> None:
    fake_system.write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    fake_system.write("proc/self/cgroup", "0::/\n")
    fake_system.write("sys/fs/cgroup/memory.max", "max\n")
    fake_system.write("sys/fs/cgroup/cpu.max", "max 100000\n")
    assert cgroup_memory_limit(fake_system.root) is None
    assert cgroup_cpu_limit(fake_system.root) is None


def test_cgroup_v2_inside_a_container_namespace_reads_the_mount_root(
    fake_system: FakeSystem,
) -> None:
    # /proc/self/cgroup names a host path that does not exist inside the container
    fake_system.write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 ro 0 0\n")
    fake_system.write("proc/self/cgroup", "0::/kubepods/pod1/abc\n")
    fake_system.write("sys/fs/cgroup/memory.max", "4294967296\n")
    fake_system.write("sys/fs/cgroup/cpu.max", "150000 100000\n")
    assert cgroup_memory_limit(fake_system.root) == 4 * GiB
    assert cgroup_cpu_limit(fake_system.root) == pytest.approx(1.5)


def test_cgroup_v1_sentinel_is_unlimited_and_real_limit_is_read(fake_system: FakeSystem) -> None:
    fake_system.write(
        "proc/mounts",
        "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,memory 0 0\n"
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n",
    )
    fake_system.write("proc/self/cgroup", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    fake_system.write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    fake_system.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    fake_system.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    assert cgroup_memory_limit(fake_system.root) is None
    assert cgroup_cpu_limit(fake_system.root) is None

    fake_system.write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "2147483648\n")
    fake_system.write("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000\n")
    fake_system.write("sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_memory_limit(fake_system.root) == 2 * GiB
    assert cgroup_cpu_limit(fake_system.root) == pytest.approx(2.5)


def test_a_limit_above_physical_ram_is_no_limit(fake_system: FakeSystem) -> None:
    fake_system.meminfo(total_kb=8 * 1024 * 1024, available_kb=6 * 1024 * 1024)
    fake_system.write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    fake_system.write("proc/self/cgroup", "0::/\n")
    fake_system.write("sys/fs/cgroup/memory.max", f"{64 * GiB}\n")
    assert detect_memory(fake_system.root).cgroup_limit is None


# ---------------------------------------------------------------- CPU


def test_cpu_quota_and_affinity_cap_usable_cores(fake_system: FakeSystem) -> None:
    fake_system.cpuinfo_x86("Intel(R) Xeon(R) Platinum 8480+", SPR_FLAGS, cores=4, threads=2)
    assert detect_cpu(fake_system.root).usable_cores == 8
    assert detect_cpu(fake_system.root, affinity=lambda: {0, 1, 2}).usable_cores == 3
    fake_system.write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    fake_system.write("proc/self/cgroup", "0::/\n")
    fake_system.write("sys/fs/cgroup/cpu.max", "150000 100000\n")
    # 1.5 CPUs of quota: two threads can make use of it
    assert detect_cpu(fake_system.root).usable_cores == 2


def test_sapphire_rapids_flags_sockets_and_cores(fake_system: FakeSystem) -> None:
    fake_system.cpuinfo_x86(
        "Intel(R) Xeon(R) Platinum 8480+", SPR_FLAGS, sockets=2, cores=4, threads=2
    )
    cpu = detect_cpu(fake_system.root)
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8480+"
    assert (cpu.logical_cores, cpu.physical_cores, cpu.sockets) == (16, 8, 2)
    assert cpu.has_avx2
    assert cpu.has_avx512
    assert cpu.has_amx
    assert {"amx_tile", "amx_int8", "amx_bf16", "avx512_bf16", "fma", "f16c", "bmi2"} <= cpu.flags
    assert "sse3" in cpu.flags  # spelled 'pni' in /proc/cpuinfo
    assert "hypervisor" not in cpu.flags
    assert "fpu" not in cpu.flags


def test_zen3_has_avx2_but_no_avx512_or_amx(fake_system: FakeSystem) -> None:
    fake_system.cpuinfo_x86(
        "AMD EPYC 7763 64-Core Processor", "fpu sse sse2 pni ssse3 fma avx f16c avx2 bmi2"
    )
    cpu = detect_cpu(fake_system.root)
    assert cpu.has_avx2
    assert not cpu.has_avx512
    assert not cpu.has_amx


def test_arm64_gb10_cores_and_features(fake_system: FakeSystem) -> None:
    fake_system.write("proc/cpuinfo", _gb10_cpuinfo())
    cpu = detect_cpu(fake_system.root)
    assert cpu.logical_cores == 20
    assert cpu.model == "10x Cortex-X925 + 10x Cortex-A725"
    assert {"asimd", "sve", "sve2", "i8mm", "dotprod", "bf16"} <= cpu.flags
    assert not cpu.has_avx2


def test_sysfs_topology_counts_physical_cores_and_numa_nodes(fake_system: FakeSystem) -> None:
    fake_system.cpuinfo_x86("Some CPU", "avx2", cores=1, threads=8)  # cpuinfo without topology
    for n in range(8):
        topology = f"sys/devices/system/cpu/cpu{n}/topology"
        fake_system.write(f"{topology}/physical_package_id", f"{n // 4}\n")
        fake_system.write(f"{topology}/core_id", f"{n % 2}\n")
    fake_system.write("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal: 1000 kB\n")
    fake_system.write("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal: 1000 kB\n")
    fake_system.write("sys/devices/system/node/node2/meminfo", "Node 2 MemTotal: 0 kB\n")
    cpu = detect_cpu(fake_system.root)
    assert (cpu.physical_cores, cpu.sockets) == (4, 2)
    assert cpu.numa_nodes == 2  # node2 has no memory


# ---------------------------------------------------------------- disk


def test_disk_walks_up_to_the_nearest_existing_folder(tmp_path: Path) -> None:
    target = tmp_path / "models" / "kimi-k3" / "UD-IQ1_S"
    disk = detect_disk(target)
    assert disk.path == str(target)
    assert disk.probed_path == str(tmp_path)
    assert not target.exists()  # measuring creates nothing
    usage = psutil.disk_usage(str(tmp_path))
    assert disk.total == usage.total
    assert abs(disk.free - usage.free) < 512 * 1024**2  # others write meanwhile
    assert disk.filesystem  # from /proc/mounts


def test_vfat_download_folder_is_warned_about(fake_system: FakeSystem, tmp_path: Path) -> None:
    stick = tmp_path / "usb stick"
    stick.mkdir()
    escaped = str(stick).replace(" ", "\\040")
    fake_system.write(
        "proc/mounts",
        f"/dev/vda / ext4 rw 0 0\n/dev/sdb1 {escaped} vfat rw,uid=1000 0 0\n",
    )
    disk = detect_disk(stick / "models", root=fake_system.root)
    assert disk.filesystem == "vfat"
    (warning,) = disk_warnings(disk)
    assert "4 GiB" in warning
    assert str(stick) in warning
    other = detect_disk(tmp_path, root=fake_system.root)
    assert other.filesystem == "ext4"
    assert disk_warnings(other) == []


def test_whole_profile_from_a_fake_machine(fake_system: FakeSystem, tmp_path: Path) -> None:
    fake_system.meminfo(total_kb=1_500_000_000, available_kb=1_450_000_000)
    fake_system.cpuinfo_x86("AMD EPYC 9554P 64-Core Processor", "avx avx2 fma avx512f", cores=64)
    profile = detect_hardware(tmp_path / "new", measure_bandwidth=False, root=fake_system.root)
    assert profile.memory.total == 1_500_000_000 * 1024
    assert profile.cpu.logical_cores == 128
    # no benchmark: estimated from the CPU model, 12ch DDR5-4800
    assert profile.memory.bandwidth.source == "estimate"
    assert profile.memory.bandwidth.bytes_per_s == pytest.approx(460.8e9)
    assert profile.disk is not None
    assert profile.disk.probed_path == str(tmp_path)


def test_unreadable_disk_gives_a_hardware_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(path: str) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(psutil, "disk_usage", boom)
    with pytest.raises(HardwareError, match="Cannot read free space"):
        detect_disk(Path("/"))
