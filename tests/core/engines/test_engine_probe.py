"""Probing engines: runs here?, flags, backends, CUDA architectures, loads kimi-k3?, images?"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from k3desk.core.engines.probe import (
    FLAGS,
    cached_probe,
    cuda_arch_covers,
    parse_cuda_archs,
    parse_devices,
    parse_help_flags,
    parse_version,
    probe_engine,
)
from k3desk.core.errors import EngineError
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths


@pytest.fixture
def h200(hardware_file: Callable[[str], Path]) -> HardwareProfile:
    return HardwareProfile.from_json_file(hardware_file("1xH200-141GB"))


@pytest.mark.engine
def test_real_engine_loads_kimi_k3_with_images(llama_server: Path) -> None:
    paths = default_paths()
    r = probe_engine(llama_server, paths)
    assert r.runs
    assert r.loads_k3 is True, r.k3_problem
    assert r.accepts_mmproj is True, r.mmproj_problem
    assert all(r.flags[f] for f in FLAGS), r.flags
    assert "CPU" in r.backends
    assert r.usable
    assert r.verdict().startswith("This engine loads Kimi-K3")
    assert r.load_seconds is not None
    assert r.load_seconds < 30
    # cached by path, size and mtime: the second answer is the stored one
    t0 = time.monotonic()
    again = probe_engine(llama_server, paths)
    assert time.monotonic() - t0 < 0.5
    assert again == r
    assert cached_probe(llama_server, paths) == r


@pytest.mark.engine
def test_cpu_engine_on_a_gpu_machine_says_the_gpus_go_unused(
    llama_server: Path, h200: HardwareProfile
) -> None:
    r = probe_engine(llama_server, default_paths())
    if "CUDA" in r.backends:
        pytest.fail("this check expects the CPU build the test machine has")
    problems = r.gpu_problems(h200)
    assert problems
    assert "no CUDA support" in problems[0]
    assert "NVIDIA H200" in problems[0]
    assert "k3desk engine install" in r.verdict(h200)


@pytest.mark.engine
def test_help_flags_of_the_real_engine(llama_server: Path) -> None:
    out = subprocess.run(
        [str(llama_server), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    flags = parse_help_flags(out.stdout + out.stderr)
    for f in (*FLAGS, "-ncmoe", "-fit", "-nr", "--host", "--port", "-m", "--api-key-file"):
        assert f in flags, f
    assert "--no-such-flag" not in flags
    assert "-1" not in flags


def test_engine_from_before_kimi_k3(fake_engine: Callable[..., Path]) -> None:
    r = probe_engine(fake_engine("old_engine"), default_paths())
    assert r.runs
    assert r.build_number == 4000
    assert r.loads_k3 is False
    assert r.verdict() == (
        "This engine cannot load Kimi-K3: it predates kimi-k3 support. "
        "`k3desk engine install` builds one that can."
    )
    assert r.reason() == "cannot load Kimi-K3: it predates kimi-k3 support"
    problems = r.problems()
    assert "it lacks --fit: it has no automatic memory fitting" in problems
    assert any(p.startswith("it lacks --rpc") for p in problems)
    assert not r.usable


def test_engine_built_for_another_cpu(fake_engine: Callable[..., Path]) -> None:
    r = probe_engine(fake_engine("sigill_version"), default_paths())
    assert not r.runs
    assert r.run_problem == "it dies with an illegal instruction (built for another CPU)"
    assert r.loads_k3 is None
    assert r.verdict() == (
        "This engine does not run on this machine: it dies with an illegal instruction "
        "(built for another CPU). `k3desk engine install` builds one that runs here."
    )


def test_engine_dying_of_sigill_while_loading(fake_engine: Callable[..., Path]) -> None:
    r = probe_engine(fake_engine("sigill"), default_paths())
    assert not r.runs
    assert "illegal instruction" in r.run_problem


def test_cuda_build_for_the_wrong_architecture(
    fake_engine: Callable[..., Path], h200: HardwareProfile
) -> None:
    r = probe_engine(fake_engine("cuda89"), default_paths())
    assert r.loads_k3 is True
    assert "CUDA" in r.backends
    assert r.devices == ("CUDA0: NVIDIA H200 (143771 MiB, 143181 MiB free)",)
    assert r.cuda_archs == ("89",)
    problems = r.gpu_problems(h200)
    assert len(problems) == 1
    assert "sm_90" in problems[0]
    assert "89" in problems[0]
    assert "sm_90" in r.verdict(h200)


def test_engine_that_refuses_the_projector_still_loads_text(
    fake_engine: Callable[..., Path],
) -> None:
    r = probe_engine(fake_engine("bad_projector"), default_paths())
    assert r.loads_k3 is True
    assert r.accepts_mmproj is False
    assert "projector" in r.mmproj_problem
    assert r.usable  # text still works
    assert "text only" in r.verdict()


def test_replaced_binary_is_probed_again(fake_engine: Callable[..., Path]) -> None:
    exe = fake_engine("old_engine")
    paths = default_paths()
    first = probe_engine(exe, paths)
    assert probe_engine(exe, paths).probed_at == first.probed_at  # cached
    shutil.copy2(fake_engine("serve"), exe)  # a newer engine in the same place
    os.utime(exe, ns=(time.time_ns(), time.time_ns()))
    second = probe_engine(exe, paths)
    assert second.probed_at > first.probed_at
    assert second.loads_k3 is True


def test_missing_or_non_executable_engine(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="does not exist"):
        probe_engine(tmp_path / "llama-server", default_paths())
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    with pytest.raises(EngineError, match="not executable"):
        probe_engine(plain, default_paths())


def test_parsers() -> None:
    assert parse_version("version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU") == (
        "0.6.0-dev (build 0, commit unknown)",
        0,
    )
    assert parse_version("version: 11434 (b11434)")[0] == "11434 (b11434)"
    line = "system_info: n_threads = 8 | CUDA : ARCHS = 890,900,1200 | USE_GRAPHS = 1 |"
    assert parse_cuda_archs(line) == ("89", "90", "120")
    assert parse_cuda_archs("CPU : AVX2 = 1") == ()
    devices = "Available devices:\n  CUDA0: NVIDIA H200 (1 MiB, 1 MiB free)\n  CUDA1: B\n"
    assert parse_devices(devices) == ("CUDA0: NVIDIA H200 (1 MiB, 1 MiB free)", "CUDA1: B")
    assert parse_devices("Available devices:\n  (none)\n") == ()
    assert cuda_arch_covers(["90"], (9, 0))
    assert not cuda_arch_covers(["89"], (9, 0))
    assert cuda_arch_covers(["120"], (12, 1))  # GB10 runs sm_120 code
    assert not cuda_arch_covers(["121"], (12, 0))
    assert not cuda_arch_covers(["90"], (10, 0))  # Hopper code does not run on B200


def test_a_check_that_could_not_finish_is_not_remembered(fake_engine: Callable[..., Path]) -> None:
    """A canary killed from outside each of its three tries (SIGKILL while loading, as the
    OOM killer does) says "try again" and is never cached: the next probe tries again."""
    exe = fake_engine("oom_killer")
    paths = default_paths()
    first = probe_engine(exe, paths)
    assert first.runs
    assert first.loads_k3 is None
    assert first.reason().startswith("could not be tried with Kimi-K3: the check could not")
    assert first.reason().endswith("; try again")
    assert cached_probe(exe, paths) is None
    again = probe_engine(exe, paths)
    assert again.probed_at > first.probed_at
