"""``k3desk doctor`` as a person runs it: a child process on this very machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from k3desk.cli.doctor import render
from k3desk.core.hardware.profile import HardwareProfile

REPO = Path(__file__).resolve().parents[3]


def run_doctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "k3desk", "doctor", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _proc_cpuinfo_flags() -> set[str]:
    path = Path("/proc/cpuinfo")
    text = path.read_text() if path.exists() else ""
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    return set(line.partition(":")[2].split())


def _gpu_library_loads() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.fixture(scope="module")
def doctor_json(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    disk = tmp_path_factory.mktemp("disk") / "models" / "not-yet"
    proc = run_doctor("--json", "--no-benchmark", "--disk", str(disk))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout, disk


def test_json_is_exactly_the_profile_json(doctor_json: tuple[str, Path]) -> None:
    out, _ = doctor_json
    data = json.loads(out)
    profile = HardwareProfile.from_dict(data)
    assert out.rstrip("\n") == profile.to_json()
    assert data["source"] == "detected"
    assert data["schema"] == 1


def test_json_ram_matches_proc_meminfo(doctor_json: tuple[str, Path]) -> None:
    data = json.loads(doctor_json[0])
    meminfo = Path("/proc/meminfo").read_text()
    total_kb = next(int(ln.split()[1]) for ln in meminfo.splitlines() if ln.startswith("MemTotal:"))
    assert data["memory"]["total"] == total_kb * 1024


def test_json_cpu_flags_match_what_this_cpu_advertises(doctor_json: tuple[str, Path]) -> None:
    flags = set(json.loads(doctor_json[0])["cpu"]["flags"])
    advertised = _proc_cpuinfo_flags()
    for flag in ("avx", "avx2", "fma", "f16c", "avx512f", "amx_tile", "amx_int8", "amx_bf16"):
        assert (flag in flags) == (flag in advertised), flag
    assert flags <= advertised | {"sse3", "dotprod"}  # only renamed spellings are added


def test_json_gpus_or_the_reason_there_are_none(doctor_json: tuple[str, Path]) -> None:
    data = json.loads(doctor_json[0])
    if _gpu_library_loads():
        assert data["gpus"], "NVML loads here, so the GPUs must be listed"
        assert all(g["architecture"] for g in data["gpus"])
    else:
        assert data["gpus"] == []
        assert "NVIDIA" in data["gpu_note"]


def test_json_disk_walks_up_to_an_existing_parent(doctor_json: tuple[str, Path]) -> None:
    out, disk = doctor_json
    d = json.loads(out)["disk"]
    assert d["path"] == str(disk)
    assert d["probed_path"] == str(disk.parent.parent)
    assert d["free"] > 0


def test_no_benchmark_estimates_and_benchmark_measures(doctor_json: tuple[str, Path]) -> None:
    assert json.loads(doctor_json[0])["memory"]["bandwidth"]["source"] == "estimate"
    proc = run_doctor("--json")
    assert proc.returncode == 0, proc.stderr
    bw = json.loads(proc.stdout)["memory"]["bandwidth"]
    assert bw["source"] == "measured"
    assert bw["bytes_per_s"] > 1e9


def test_human_summary(tmp_path: Path) -> None:
    proc = run_doctor("--no-benchmark", "--disk", str(tmp_path / "x"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    flags = _proc_cpuinfo_flags()

    def yes(flag: str) -> str:
        return "yes" if flag in flags else "no"

    if "asimd" in flags:
        assert f"NEON yes, dotprod {yes('asimddp')}, SVE {yes('sve')}" in out
    else:
        assert f"AVX2 {yes('avx2')}, AVX-512 {yes('avx512f')}, AMX {yes('amx_tile')}" in out
    assert "Memory" in out
    assert "GPUs" in out
    assert f"{tmp_path / 'x'} (measured at {tmp_path})" in out
    if not _gpu_library_loads():
        assert "none: " in out


def test_render_of_hardware_files(hardware_file: Callable[[str], Path]) -> None:
    spark = render(HardwareProfile.from_json_file(hardware_file("3xGB10-node")))
    assert "unified memory" in spark
    assert "compute capability 12.1 (sm_121), Blackwell" in spark
    assert "SVE yes" in spark
    assert "I8MM yes" in spark

    dgx = render(HardwareProfile.from_json_file(hardware_file("8xH100-2TB")))
    assert dgx.count("NVIDIA H100 80GB HBM3") == 8
    assert "compute capability 9.0 (sm_90), Hopper" in dgx
    assert "3.35 TB/s (table)" in dgx
    assert "614.4 GB/s (estimate)" in dgx
    assert "AMX yes" in dgx

    cpu_only = render(HardwareProfile.from_json_file(hardware_file("epyc9554p-1.5TB-cpu")))
    assert "none: No NVIDIA driver found" in cpu_only
    assert "AVX-512 yes, AMX no" in cpu_only


def test_cgroup_limit_is_shown(hardware_file: Callable[[str], Path]) -> None:
    from dataclasses import replace

    p = HardwareProfile.from_json_file(hardware_file("no-gpu-laptop-32GB"))
    limited = replace(p, memory=replace(p.memory, cgroup_limit=8 * 1024**3))
    assert "container (cgroup) limit 8.0 GiB" in render(limited)
    assert "no container memory limit" in render(p)


def test_vfat_disk_warning_is_shown(hardware_file: Callable[[str], Path]) -> None:
    from dataclasses import replace

    p = HardwareProfile.from_json_file(hardware_file("no-gpu-laptop-32GB"))
    assert p.disk is not None
    fat = replace(p, disk=replace(p.disk, filesystem="vfat"))
    assert "warning:" in render(fat)
    assert "4 GiB" in render(fat)
