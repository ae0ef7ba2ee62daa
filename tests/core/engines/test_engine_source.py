"""`k3desk engine install --source`: a real `git fetch` of a local repository and a real
CMake build of a small project laid out like llama.cpp (targets llama-server and
llama-mtmd-cli in build/bin).  Its llama-server execs the real one (or a stand-in that
knows the fork's projector), so the probe after the build is the real probe."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from k3desk.app import Services
from k3desk.cli import main
from k3desk.core.catalog.loader import load_catalog
from k3desk.core.catalog.model import KNOWN_FORKS
from k3desk.core.engines.discovery import discover_engines, engine_manifest
from k3desk.core.engines.install import BuildConfig, choose_build
from k3desk.core.engines.probe import probe_engine
from k3desk.core.engines.source import (
    FORKS,
    SOURCE_ARGS,
    GitSource,
    install_from_git,
    parse_source,
    vision_check,
)
from k3desk.core.errors import Cancelled, EngineError
from k3desk.core.hardware.profile import CpuInfo, HardwareProfile, MemoryInfo
from k3desk.core.paths import default_paths
from k3desk.core.progress import CancelToken, Progress
from k3desk.core.resources import resources_dir
from tests.fixtures.engine import write_fake

CMAKELISTS = """cmake_minimum_required(VERSION 3.16)
project(tiny-llama C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(llama-server server.c @EXTRA@)
add_executable(llama-mtmd-cli mtmd-cli.c)
"""
SERVER_C = """#include <unistd.h>
int main(int argc, char **argv) { (void)argc; execv("@TARGET@", argv); return 127; }
"""
MTMD_C = 'int main(void) { return 0; }\n'
SLOW = """add_custom_command(OUTPUT slow.c COMMAND ${CMAKE_COMMAND} -E sleep 61.25
                   COMMAND ${CMAKE_COMMAND} -E touch slow.c)
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def make_repo(path: Path, target: Path) -> dict[str, str]:
    """A repository whose main builds a llama-server that execs ``target``; branches
    'broken' (a compile error), 'slow' (a build step that sleeps) and 'other' (an engine
    that execs ``target`` too, one commit later).  Returns name -> commit."""
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    git(path, "config", "user.email", "t@example.org")
    git(path, "config", "user.name", "t")

    def commit(extra: str = "", server: str = SERVER_C, lists_extra: str = "") -> str:
        (path / "CMakeLists.txt").write_text(CMAKELISTS.replace("@EXTRA@", extra) + lists_extra)
        (path / "server.c").write_text(server.replace("@TARGET@", str(target)))
        (path / "mtmd-cli.c").write_text(MTMD_C)
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", "tiny llama")
        return git(path, "rev-parse", "HEAD")

    commits = {"main": commit()}
    git(path, "checkout", "-q", "-b", "broken")
    commits["broken"] = commit(server="int main(void) { return oops; }\n")
    git(path, "checkout", "-q", "-b", "slow", "main")
    commits["slow"] = commit(extra="slow.c", lists_extra=SLOW)
    git(path, "checkout", "-q", "-b", "other", "main")
    (path / "NOTE").write_text("one more commit\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "note")
    commits["other"] = git(path, "rev-parse", "HEAD")
    git(path, "checkout", "-q", "main")
    return commits


@pytest.fixture
def cpu_config() -> BuildConfig:
    hw = HardwareProfile(
        CpuInfo("Xeon", 2, 2, 2, flags=frozenset({"avx2"})),
        MemoryInfo(total=8 << 30, available=8 << 30, swap_total=0),
    )
    return choose_build(hw, None, machine="x86_64")


def leftovers() -> list[str]:
    root = default_paths().engines_dir
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_the_forks_k3desk_builds_are_the_ones_the_catalog_may_name() -> None:
    """Every fork a tier may name as its vision engine can be built, by that name."""
    assert tuple(FORKS) == KNOWN_FORKS
    assert all(FORKS[name].name == name for name in KNOWN_FORKS)
    vision = {t.vision_engine for t in load_catalog(resources_dir() / "catalog.json").tiers}
    assert vision - {""} <= set(FORKS)


def test_parse_source() -> None:
    assert parse_source("unsloth") == FORKS["unsloth"]
    assert parse_source("unsloth").ref == "pull/48/head"
    assert parse_source("atomicchat").ref == "pull/58/head"
    assert parse_source("https://github.com/x/llama.cpp@pull/48/head") == GitSource(
        "https://github.com/x/llama.cpp", "pull/48/head"
    )
    assert parse_source("git@github.com:x/llama.cpp.git@dev") == GitSource(
        "git@github.com:x/llama.cpp.git", "dev"
    )
    assert parse_source("git@github.com:x/llama.cpp.git").ref == ""
    assert parse_source("https://user@host/x/y").ref == ""
    for bad in ("nonsense", "https://github.com/x/y@", "https://h/x@--upload-pack=evil", " "):
        with pytest.raises(EngineError):
            parse_source(bad)


def test_builds_from_a_local_git_repository_probes_and_says_what_it_sees(
    tmp_path: Path, llama_server: Path, cpu_config: BuildConfig
) -> None:
    commits = make_repo(tmp_path / "repo", llama_server)
    paths = default_paths()
    seen: list[Progress] = []
    lines: list[str] = []
    eng = install_from_git(
        paths,
        cpu_config,
        parse_source(f"{tmp_path / 'repo'}@other"),
        jobs=2,
        progress=seen.append,
        on_line=lines.append,
    )
    stages = [p.stage for p in seen]
    assert stages.index("fetch") < stages.index("configure") < stages.index("build")
    assert [p.done for p in seen if p.stage == "build"][-1] == 100
    assert seen[-1] == Progress("install", 100, 100, f"installed {eng.folder.name}")
    # exactly the ref asked for, the binaries only, a manifest discovery reads
    manifest = json.loads((eng.folder / "engine.json").read_text())
    assert manifest["commit"] == commits["other"]
    assert manifest["source"] == f"{tmp_path / 'repo'}@other"
    assert manifest["cmake_args"][:2] == ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF"]
    assert list(cpu_config.cmake_args) == manifest["cmake_args"][len(SOURCE_ARGS) :]
    assert sorted(p.name for p in (eng.folder / "bin").iterdir()) == [
        "llama-mtmd-cli", "llama-server",
    ]  # fmt: skip
    assert not (eng.folder / "src").exists()
    assert not (eng.folder / "build").exists()
    assert eng.folder.name.startswith(f"llama-cpp-repo-{commits['other'][:10]}-cpu")
    assert leftovers() == [eng.folder.name]
    assert engine_manifest(eng.server)["commit"] == commits["other"]
    found = discover_engines(paths, env={"PATH": ""})
    assert found[0].path == eng.server
    log = eng.log_file.read_text()
    for step in ("fetch --progress --depth 1", "cmake", "--target llama-server llama-mtmd-cli"):
        assert step in log, step
    assert any("Building C object" in line for line in lines)

    # the probe of the built engine is the real one: it loads Kimi-K3, and it does not
    # know the vision projector of 6block's tiers (upstream b11434 has no kimik3)
    result = probe_engine(eng.server, paths, use_cache=False)
    assert result.loads_k3 is True
    assert result.accepts_mmproj is True  # the LLaVA-style canary projector
    tiers = {t.id: t for t in load_catalog(resources_dir() / "catalog.json").tiers}
    check = vision_check(eng.server, paths, tiers["6block-iq1s-xs"])
    assert check is not None
    assert not check.usable
    assert check.projector_type == "kimik3"
    assert check.build == FORKS["unsloth"]
    assert "does not know the 'kimik3' vision projector" in check.reason
    assert vision_check(eng.server, paths, tiers["vcruz305-ud-iq1s"]) is None  # no vision


def test_a_commit_a_failed_build_and_a_cancel_leave_nothing_behind(
    tmp_path: Path, llama_server: Path, cpu_config: BuildConfig
) -> None:
    commits = make_repo(tmp_path / "repo", llama_server)
    paths = default_paths()
    repo = tmp_path / "repo"
    # a commit id (not a branch): fetched and built as is
    eng = install_from_git(paths, cpu_config, GitSource(str(repo), commits["main"]), jobs=2)
    assert json.loads((eng.folder / "engine.json").read_text())["commit"] == commits["main"]
    good = leftovers()
    # a compile error: named, nothing installed, the working engine kept
    with pytest.raises(EngineError) as err:
        install_from_git(paths, cpu_config, GitSource(str(repo), "broken"), jobs=2)
    assert err.value.message.startswith("Building failed (exit")
    assert "oops" in err.value.message
    assert "Nothing was installed" in err.value.hint
    assert leftovers() == good
    with pytest.raises(EngineError, match="has no branch, tag or commit 'nowhere'"):
        install_from_git(paths, cpu_config, GitSource(str(repo), "nowhere"), jobs=2)
    assert leftovers() == good
    # cancelled in the middle of the build: the build's children die with it
    cancel = CancelToken()

    def stop_when_building(p: Progress) -> None:
        if p.stage == "build" and not cancel.cancelled:
            threading.Timer(0.5, cancel.cancel).start()

    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        install_from_git(paths, cpu_config, GitSource(str(repo), "slow"), jobs=2,
                         progress=stop_when_building, cancel=cancel)  # fmt: skip
    assert time.monotonic() - t0 < 30
    assert leftovers() == good
    sleepers = [
        p for p in psutil.process_iter(["cmdline"]) if "61.25" in " ".join(p.info["cmdline"] or [])
    ]
    assert sleepers == []


def test_engine_install_source_on_the_command_line_and_a_fork_that_knows_the_projector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # an engine that knows kimik3, as the unsloth fork does
    fork_server = write_fake(tmp_path / "fork", "serve", FAKE_PROJECTOR_TYPES="mlp,kimik3")
    make_repo(tmp_path / "repo", fork_server)
    services = Services()
    rc = main(["engine", "install", "--source", str(tmp_path / "repo"), "--cpu", "--jobs", "2",
               "--tier", "6block-iq1s-xs"], services)  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"source: {tmp_path / 'repo'}" in out
    assert "targets: llama-server llama-mtmd-cli" in out
    assert "[100%]" in out
    assert "kimi-k3:   yes" in out
    assert "images with IQ1_S-XS (6block): yes: This engine knows IQ1_S-XS (6block)'s" in out
    server = next(iter(default_paths().engines_dir.glob("llama-cpp-repo-*/bin/llama-server")))
    assert main(["engine", "probe", str(server), "--tier", "6block-iq1s-xs"], services) == 0
    assert "tier images: yes" in capsys.readouterr().out
    # no such source: a clear message, no traceback
    assert main(["engine", "install", "--source", "nonsense", "--dry-run"], services) == 1
    assert "neither a known fork (unsloth, atomicchat) nor a git URL" in capsys.readouterr().err
