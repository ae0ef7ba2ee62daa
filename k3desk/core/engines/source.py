"""Build llama-server (and the mtmd tools) from a git source: the llama.cpp forks that carry
Kimi-K3's vision tower, or any repository and ref.

Upstream llama.cpp b11434 loads kimi-k3 text but has no K3 vision projector; the cards
point at two forks, each with its own pull request:

* ``unsloth``: unslothai/llama.cpp, ``pull/48/head`` (the ``kimi-k3-fullsize-vision``
  branch, projector type ``kimik3`` in tools/mtmd/clip-impl.h), as 6block's card builds it:
  ``git fetch origin pull/48/head:kimi-k3-fullsize-vision``, then
  ``cmake ... -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
  -DCMAKE_BUILD_TYPE=Release`` and ``--target ... llama-mtmd-cli llama-server``;
* ``atomicchat``: AtomicBot-ai/atomic-llama-cpp-turboquant, ``pull/58/head`` (its card:
  ``git fetch origin pull/58/head:kimi-k3``, ``cmake -B build -DCMAKE_BUILD_TYPE=Release``,
  ``--target llama-cli llama-mtmd-cli``).

:func:`install_from_git` fetches exactly one ref (``git fetch --depth 1``, falling back to a
full fetch for a commit the server will not hand out alone), configures with the flags
:func:`k3desk.core.engines.install.choose_build` picks for the detected GPUs, builds the
``llama-server`` and ``llama-mtmd-cli`` targets, and installs them the way
:func:`~k3desk.core.engines.install.install_engine` installs a PyPI build: progress, a
cancel that kills the whole process group, one log file, a staging folder renamed into
place only when the server runs, a manifest :mod:`~k3desk.core.engines.discovery` reads.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from k3desk.core.catalog.model import Tier
from k3desk.core.engines.discovery import MANIFEST, SERVER_NAME, engine_manifest
from k3desk.core.engines.install import (
    BUILD_TIME_LIMIT,
    BuildConfig,
    InstalledEngine,
    _run_build,
    _swap_into_place,
    check_runs,
    staged,
)
from k3desk.core.engines.probe import probe_projector
from k3desk.core.errors import EngineError, K3Error
from k3desk.core.gguf.reader import read_header
from k3desk.core.paths import AppPaths
from k3desk.core.private import private_dir, write_private
from k3desk.core.process import run as run_child
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress

TARGETS = ("llama-server", "llama-mtmd-cli")  # the server, and the mtmd tools' CLI
# Flags for every source build: a static build (the unsloth card's) leaves one binary
# that needs no library path; $ORIGIN covers a source that builds shared libraries anyway.
# No libcurl (the AtomicChat card's -DLLAMA_CURL=OFF: k3desk downloads the models) and no
# web UI fetched from the Hub while building (LLAMA_USE_PREBUILT_UI, b11434).
SOURCE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DCMAKE_BUILD_RPATH=$ORIGIN",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)


@dataclass(frozen=True)
class GitSource:
    """A repository and the ref to build (branch, tag, commit or ``pull/N/head``)."""

    url: str
    ref: str = ""  # "" = the repository's default branch
    name: str = ""  # "unsloth", "atomicchat", or "" for a source of one's own
    note: str = ""

    @property
    def label(self) -> str:
        return f"{self.url}@{self.ref}" if self.ref else self.url

    @property
    def slug(self) -> str:
        if self.name:
            return self.name
        tail = re.sub(r"\.git$", "", self.url.rstrip("/")).rsplit("/", 1)[-1]
        return re.sub(r"[^A-Za-z0-9._-]+", "-", tail) or "git"


FORKS: dict[str, GitSource] = {
    "unsloth": GitSource(
        "https://github.com/unslothai/llama.cpp",
        "pull/48/head",
        "unsloth",
        "unsloth's fork with Kimi-K3's MoonViT-3d vision tower (PR 48)",
    ),
    "atomicchat": GitSource(
        "https://github.com/AtomicBot-ai/atomic-llama-cpp-turboquant",
        "pull/58/head",
        "atomicchat",
        "AtomicChat's fork with Kimi-K3 text and vision (PR 58, MoonViT-V2 in mtmd)",
    ),
}


def _path_start(url: str) -> int:
    """Where the path of a git URL starts: after 'scheme://host', after 'host:' of the
    scp form (user@host:path), else at 0 (a local path)."""
    m = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://[^/]*", url)
    if m:
        return m.end()
    m = re.match(r"[^/:]+:", url)
    return m.end() if m else 0


# The transports k3desk fetches over (git's GIT_ALLOW_PROTOCOL, see git(1)): no remote
# helpers (``ext::`` runs a command, ``fd::`` talks over a file descriptor and hangs)
ALLOWED_PROTOCOLS = ("https", "http", "ssh", "git", "file")
_SCHEMES = {"https", "http", "ssh", "git", "file", "git+ssh", "ssh+git"}
# git's "<transport>::<address>" (transport.c, transport_get): a remote helper
_HELPER = re.compile(r"[A-Za-z0-9][A-Za-z0-9+.-]*::")
_BAD_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|^[-/.]|/$|\.lock$|//")
# time limits of the steps that are not the build itself
FETCH_TIME_LIMIT = 30 * 60.0
STEP_TIME_LIMIT = 5 * 60.0
QUERY_TIME_LIMIT = 60.0


def source_problem(source: GitSource) -> str:
    """Why k3desk will not hand ``source`` to git ("" when it will).

    The URL and ref reach git's command line: nothing in them may read as an option
    (a leading ``-``, e.g. ``--upload-pack=...``), name a transport k3desk does not
    support (``ext::``, ``fd::``, any remote helper), or hide a host that ssh would
    read as an option.
    """
    url, ref = source.url, source.ref
    if not url:
        return "no URL is given"
    if re.search(r"[\x00-\x1f\x7f]", url):
        return "the URL has control characters"
    if url.startswith("-"):
        return "the URL starts with '-', so git would read it as an option"
    if _HELPER.match(url):
        return (
            f"{url.split('::', 1)[0]}:: is a git remote helper, not a transport k3desk "
            f"supports ({', '.join(ALLOWED_PROTOCOLS)})"
        )
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)", url)
    if m:
        if m.group(1).lower() not in _SCHEMES:
            return (
                f"{m.group(1)}:// is not a transport k3desk supports "
                f"({', '.join(ALLOWED_PROTOCOLS)})"
            )
        host = m.group(2).rsplit("@", 1)[-1]
        if host.startswith("-"):
            return "the host starts with '-', so ssh would read it as an option"
    elif not url.startswith("/"):
        scp = re.match(r"([^/:]+):", url)  # [user@]host:path, as git reads it
        if scp is None:
            return "it is neither a URL, [user@]host:path nor an absolute folder"
        if any(part.startswith("-") for part in scp.group(1).split("@")):
            return "the host starts with '-', so ssh would read it as an option"
    if ref and _BAD_REF.search(ref):
        return f"{ref!r} is not a git ref"
    return ""


def check_source(source: GitSource) -> None:
    problem = source_problem(source)
    if problem:
        raise EngineError(
            f"k3desk will not fetch {source.label!r}: {problem}.",
            "Give a URL such as https://github.com/OWNER/llama.cpp[@REF], a known fork "
            f"({', '.join(FORKS)}) or a local folder.",
        )


def git_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment every git step runs in: no prompt, only the transports k3desk
    supports, and a stalled transfer ends (under a 1 KiB/s for a minute)."""
    env = {
        **base,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": ":".join(ALLOWED_PROTOCOLS),
        "GIT_HTTP_LOW_SPEED_LIMIT": "1024",
        "GIT_HTTP_LOW_SPEED_TIME": "60",
    }
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    return env


def parse_source(text: str) -> GitSource:
    """``unsloth``, ``atomicchat``, or ``GIT_URL[@REF]`` (a local folder works too)."""
    text = text.strip()
    if not text:
        raise EngineError(
            "No source given.",
            f"Use one of {', '.join(FORKS)} or a git URL, optionally with @REF.",
        )
    if text in FORKS:
        return FORKS[text]
    start = _path_start(text)
    at = text.rfind("@", start)
    url, ref = (text[:at], text[at + 1 :]) if at >= 0 else (text, "")
    if not url or (at >= 0 and not ref):
        raise EngineError(
            f"{text!r} is not GIT_URL[@REF].",
            "Example: https://github.com/unslothai/llama.cpp@pull/48/head",
        )
    if re.match(r"-", ref) or re.search(r"\s|\.\.", ref):
        raise EngineError(
            f"{ref!r} is not a git ref.", "Give a branch, tag, commit or pull/N/head."
        )
    local = start == 0 and Path(url).expanduser().exists()
    if start == 0 and not local and not text.startswith(("/", ".", "~")) and "/" not in url:
        raise EngineError(
            f"{text!r} is neither a known fork ({', '.join(FORKS)}) nor a git URL.",
            "Give a URL such as https://github.com/OWNER/llama.cpp, or a local folder.",
        )
    if start == 0 and not url.startswith("-"):  # a local folder: absolute for git
        url = str(Path(url).expanduser().resolve())
    source = GitSource(url, ref)
    check_source(source)
    return source


def find_tool(name: str, env: Mapping[str, str] | None = None) -> Path | None:
    """``name`` on PATH, else beside this Python (a venv with ``pip install cmake``)."""
    e = os.environ if env is None else env
    found = shutil.which(name, path=e.get("PATH"))
    if found:
        return Path(found)
    local = Path(sys.executable).parent / name
    return local if local.is_file() and os.access(local, os.X_OK) else None


def _tools() -> tuple[Path, Path]:
    git, cmake = find_tool("git"), find_tool("cmake")
    missing = [n for n, p in (("git", git), ("cmake", cmake)) if p is None]
    if missing or git is None or cmake is None:
        raise EngineError(
            f"Building from a git source needs {' and '.join(missing)}, which this machine "
            "does not have.",
            "Install them (Debian/Ubuntu: sudo apt install git cmake build-essential; cmake "
            "also comes with `pip install cmake`), then try again.",
        )
    return git, cmake


def source_folder_name(source: GitSource, commit: str, config: BuildConfig) -> str:
    return f"llama-cpp-{source.slug}-{commit[:10]}-{config.slug}"


_GIT_PERCENT = re.compile(r"(Receiving|Resolving) (objects|deltas):\s+(\d{1,3})%")


def parse_git_line(line: str) -> Progress | None:
    """git's own progress ("Receiving objects:  45% (…)"), or None."""
    found = list(_GIT_PERCENT.finditer(line))  # \r-separated updates arrive as one line
    if not found:
        return None
    m = found[-1]
    return Progress("fetch", int(m.group(3)), 100, f"{m.group(1)} {m.group(2)}")


@dataclass
class _Steps:
    """The build steps of one install, each in its own process group, into one log."""

    env: Mapping[str, str]
    log_file: Path
    progress: ProgressCallback
    cancel: CancelToken
    kill_grace: float
    done: int = 0

    def run(
        self,
        argv: list[str],
        what: str,
        lines: Callable[[str], None] | None = None,
        limit: float = STEP_TIME_LIMIT,
    ) -> None:
        _run_build(
            argv,
            self.env,
            self.log_file,
            self.progress,
            self.cancel,
            self.kill_grace,
            lines,
            append=self.done > 0,
            what=what,
            time_limit=limit,
        )
        self.done += 1


def install_from_git(
    paths: AppPaths,
    config: BuildConfig,
    source: GitSource,
    *,
    jobs: int | None = None,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    kill_grace: float = 5.0,
    on_line: Callable[[str], None] | None = None,
) -> InstalledEngine:
    """Fetch ``source``, build ``llama-server`` and ``llama-mtmd-cli`` with ``config``'s flags,
    and install them; return the new engine (see the module docstring)."""
    cancel = cancel or CancelToken()
    check_source(source)
    git, cmake = _tools()
    root = paths.engines_dir
    private_dir(root)
    private_dir(paths.logs_dir)
    staging = root / f".building-{source.slug}-{secrets.token_hex(4)}"
    src, build, bindir = staging / "src", staging / "build", staging / "bin"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_file = paths.logs_dir / f"engine-install-{stamp}-{source.slug}.log"
    env = git_env({**os.environ, "PYTHONUNBUFFERED": "1"})
    steps = _Steps(env, log_file, progress, cancel, kill_grace)
    with staged(staging, log_file):
        commit = _fetch(steps, git, src, source, on_line)
        args = [*SOURCE_ARGS, *config.cmake_args]
        progress(Progress("configure", 0, 100, " ".join(args)))
        steps.run([str(cmake), "-S", str(src), "-B", str(build), *args], "Configuring",
                  on_line, FETCH_TIME_LIMIT)  # fmt: skip
        n = str(jobs or os.cpu_count() or 1)
        steps.run(
            [str(cmake), "--build", str(build), "--config", "Release", "-j", n,
             "--target", *TARGETS],
            "Building",
            on_line,
            BUILD_TIME_LIMIT,
        )  # fmt: skip
        _collect(build, bindir, log_file)
        server = bindir / SERVER_NAME
        check_runs(server, log_file)
        cancel.raise_if_cancelled()
        final = root / source_folder_name(source, commit or "unknown", config)
        version = f"git {commit[:12]}" if commit else "git"
        manifest = {
            "server": str(server.relative_to(staging)),
            "version": version,
            "source": source.label,
            "source_name": source.name,
            "commit": commit,
            "backend": config.backend,
            "cmake_args": args,
            "cuda_archs": list(config.cuda_archs),
            "notes": list(config.notes),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "log": str(log_file),
        }
        write_private(staging / MANIFEST, json.dumps(manifest, indent=2))
        shutil.rmtree(src, ignore_errors=True)  # the binaries are all that stays
        shutil.rmtree(build, ignore_errors=True)
        cancel.raise_if_cancelled()
        _swap_into_place(staging, final)
    progress(Progress("install", 100, 100, f"installed {final.name}"))
    return InstalledEngine(final, final / "bin" / SERVER_NAME, config, version, log_file)


def _fetch(
    steps: _Steps,
    git: Path,
    src: Path,
    source: GitSource,
    on_line: Callable[[str], None] | None,
) -> str:
    """Fetch ``source`` into ``src`` and check it out; its commit ("" if git cannot say)."""
    progress, cancel = steps.progress, steps.cancel

    def git_lines(line: str) -> None:
        if on_line is not None:
            on_line(line)
        p = parse_git_line(line)
        if p is not None and not cancel.cancelled:
            progress(p)

    progress(Progress("fetch", 0, 0, f"fetching {source.label}"))
    private_dir(src)
    steps.run([str(git), "init", "-q", "--", str(src)], "git init", on_line)
    ref = source.ref or "HEAD"
    fetch = [str(git), "-C", str(src), "fetch", "--progress"]
    # "--": the URL and the ref are never read as options (checked, too: check_source)
    try:
        steps.run([*fetch, "--depth", "1", "--", source.url, ref], f"Fetching {source.label}",
                  git_lines, FETCH_TIME_LIMIT)  # fmt: skip
        target = "FETCH_HEAD"
    except EngineError:
        # a commit a server will not hand out alone, or a dumb transport: fetch it all
        cancel.raise_if_cancelled()
        steps.run([*fetch, "--", source.url, "+refs/*:refs/remotes/src/*"],
                  f"Fetching {source.url}", git_lines, FETCH_TIME_LIMIT)  # fmt: skip
        target = _resolve(git, src, ref, source, steps.log_file, steps.env)
    steps.run([str(git), "-C", str(src), "checkout", "-q", "--detach", target], "git checkout")
    return _query(git, src, ["rev-parse", "HEAD"], steps.env)


def _query(git: Path, src: Path, args: list[str], env: Mapping[str, str]) -> str:
    """The output of a quick git command ("" when it fails or takes over a minute)."""
    try:
        done = run_child([str(git), "-C", str(src), *args], env=env, timeout=QUERY_TIME_LIMIT)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _resolve(
    git: Path, src: Path, ref: str, source: GitSource, log_file: Path, env: Mapping[str, str]
) -> str:
    """The commit ``ref`` names after a full fetch into refs/remotes/src/."""
    for cand in (ref, f"refs/remotes/src/heads/{ref}", f"refs/remotes/src/tags/{ref}",
                 f"refs/remotes/src/{ref}"):  # fmt: skip
        query = ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{cand}^{{commit}}"]
        found = _query(git, src, query, env)
        if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", found):
            return found
    raise EngineError(
        f"{source.url} has no branch, tag or commit {ref!r}.",
        f"Check the ref (for a pull request: pull/N/head); the log: {log_file}",
    )


def _collect(build: Path, bindir: Path, log_file: Path) -> None:
    """The built programs (and any shared libraries beside them) into ``bindir``."""
    out = build / "bin"
    missing = [t for t in TARGETS if not (out / t).is_file()]
    if missing:
        raise EngineError(
            f"The build finished but produced no {', '.join(missing)} in {out}.",
            f"This source may not have those targets; see the log: {log_file}",
        )
    private_dir(bindir)
    for f in out.iterdir():
        if f.is_file() and (os.access(f, os.X_OK) or ".so" in f.name):
            shutil.copy2(f, bindir / f.name)


# ------------------------------------------------------------------ vision
@dataclass(frozen=True)
class VisionCheck:
    """Whether an engine can show images with a tier's projector, and what to build if not."""

    usable: bool
    reason: str  # one sentence
    build: GitSource | None = None  # the source to build when it cannot
    projector_type: str = ""


def projector_type_of(tier: Tier | None, mmproj: Path | None = None) -> str:
    """The tier's projector type: from the mmproj file's own header when there is one,
    else the catalog's ('' when neither says)."""
    if mmproj is not None and mmproj.is_file():
        try:
            value = read_header(mmproj).get("clip.projector_type")
        except (K3Error, OSError):
            value = None
        if isinstance(value, str) and value:
            return value
    return tier.mmproj_type if tier is not None else ""


def vision_check(
    engine: Path,
    paths: AppPaths,
    tier: Tier,
    mmproj: Path | None = None,
    *,
    cancel: CancelToken | None = None,
) -> VisionCheck | None:
    """Can ``engine`` take ``tier``'s vision projector?  None when the tier has no vision.

    The engine is asked about the projector's type (:func:`probe_projector`); where no
    source states the type, only an engine built from the fork the tier's card names is
    taken to have it.
    """
    if tier.vision == "none" or not (tier.mmproj or mmproj is not None):
        return None
    build = FORKS.get(tier.vision_engine)
    fork = f"the {build.name} fork" if build else "a fork with its vision tower"
    ptype = projector_type_of(tier, mmproj)
    who = f"{tier.name} ({tier.publisher})"
    if ptype:
        check = probe_projector(engine, paths, ptype, cancel=cancel)
        if check.known:
            return VisionCheck(True, f"This engine knows {who}'s {ptype!r} projector.", None, ptype)
        return VisionCheck(
            False,
            f"This engine cannot show images with {who}: {check.detail}; {fork} has it.",
            build,
            ptype,
        )
    built_from = str(engine_manifest(engine).get("source_name", ""))
    if build is not None and built_from == build.name:
        return VisionCheck(True, f"This engine was built from {fork}, which {who}'s card names.")
    return VisionCheck(
        False,
        f"{who}'s card does not name its projector type, and this engine was not built "
        f"from {fork}, which the card names for images.",
        build,
    )
