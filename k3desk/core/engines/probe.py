"""What can this llama-server do here?  Probe it once and remember the answer.

A probe runs the executable with ``--version``, ``--help`` and
``--list-devices``, then serves a tiny generated kimi-k3 "canary" with a tiny
vision projector.  The version string cannot tell whether an engine knows
kimi-k3 (PyPI builds print ``build 0``), so only loading one can.  Results
are cached in ``AppPaths.cache`` keyed by path, size and modification time,
so a rebuilt or replaced binary is probed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from k3desk.core.engines.canary import write_k3_gguf, write_mlp_projector
from k3desk.core.engines.crash import classify_exit
from k3desk.core.engines.identity import keyed_get
from k3desk.core.engines.supervisor import LaunchSpec, RestartPolicy, Supervisor
from k3desk.core.errors import Cancelled, EngineError
from k3desk.core.hardware.nvidia import launch_env
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.k3arch import TINY_K3
from k3desk.core.localfiles import check_dict, load_checked
from k3desk.core.paths import AppPaths
from k3desk.core.planning.argv import (
    API_KEY,
    API_KEY_FILE,
    CORS_ORIGINS,
    FIT,
    JINJA,
    MMPROJ,
    N_CPU_MOE,
    NO_CORS_CREDENTIALS,
    NO_MMPROJ_OFFLOAD,
    NO_REPACK,
    RPC,
    VERBOSITY,
    canary_args,
)
from k3desk.core.private import write_private
from k3desk.core.process import OUTPUT_LIMIT
from k3desk.core.process import run as run_child
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress
from k3desk.core.safepaths import mode_kind

PROBE_SCHEMA = 4  # 4: the CORS flags are probed
CACHE_FILE = "engine-probes.json"
INSTALL = "`k3desk engine install`"

# Flags k3desk uses, and what it loses without them.
FLAGS: dict[str, str] = {
    N_CPU_MOE.name: "cannot keep expert layers in RAM (needed for every hybrid plan)",
    FIT.name: "has no automatic memory fitting",
    MMPROJ.name: "cannot take images",
    NO_MMPROJ_OFFLOAD.name: "cannot keep the vision projector on the CPU",
    RPC.name: "cannot spread layers over other machines",
    API_KEY.name: "cannot require an API key (k3desk will not start it without one)",
    API_KEY_FILE.name: "needs the API key on its command line, where other local users can see it",
    CORS_ORIGINS.name: "lets a web page of any site read its answers in a browser (no CORS limit)",
    NO_CORS_CREDENTIALS.name: "allows credentials to any web page it answers",
    NO_REPACK.name: "cannot turn off weight repacking (the AMX workaround)",
    JINJA.name: "cannot use the model's chat template",
}
_LIB_BACKENDS = {
    "cuda": "CUDA",
    "vulkan": "Vulkan",
    "metal": "Metal",
    "hip": "ROCm",
    "sycl": "SYCL",
    "cpu": "CPU",
    "rpc": "RPC",
}


@dataclass(frozen=True)
class ProbeResult:
    path: str
    size: int
    mtime_ns: int
    runs: bool
    run_problem: str = ""
    version: str = ""
    build_number: int | None = None
    flags: dict[str, bool] = field(default_factory=dict)
    backends: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    cuda_archs: tuple[str, ...] = ()  # e.g. ("90", "120")
    loads_k3: bool | None = None  # None: not tried (it does not run)
    k3_problem: str = ""
    accepts_mmproj: bool | None = None
    mmproj_problem: str = ""
    load_seconds: float | None = None
    probed_at: float = 0.0
    schema: int = PROBE_SCHEMA

    @property
    def usable(self) -> bool:
        return self.runs and self.loads_k3 is True and self.flags.get("--api-key", False)

    def reason(self) -> str:
        """Why k3desk cannot use this engine, as a predicate ("cannot load Kimi-K3: ..."),
        without advice; "" when it is usable."""
        if not self.runs:
            return f"does not run on this machine: {as_clause(self.run_problem)}"
        if self.loads_k3 is False:
            return f"cannot load Kimi-K3: {as_clause(self.k3_problem)}"
        if self.loads_k3 is None and self.k3_problem:
            return f"could not be tried with Kimi-K3: {as_clause(self.k3_problem)}; try again"
        if self.loads_k3 is None:
            return "has not been tried with Kimi-K3 yet"
        if not self.flags.get("--api-key", False):
            return "lacks --api-key, so it would answer anyone without a key"
        return ""

    def gpu_problems(self, hw: HardwareProfile | None) -> list[str]:
        """Mismatches between the compiled GPU support and the detected GPUs."""
        if hw is None or not hw.gpus:
            return []
        if "CUDA" not in self.backends:
            names = ", ".join(sorted({g.name for g in hw.gpus}))
            return [
                f"it has no CUDA support, so the GPUs ({names}) would go unused; build a CUDA "
                f"engine for them with {INSTALL} (it needs the CUDA toolkit)"
            ]
        if not self.cuda_archs:
            return []
        built = ", ".join(f"sm_{a}" for a in self.cuda_archs)
        what = "architecture" if len(self.cuda_archs) == 1 else "architectures"
        problems = []
        for g in hw.gpus:
            if not cuda_arch_covers(self.cuda_archs, g.compute_capability):
                problems.append(
                    f"it was compiled for CUDA {what} {built}, which cannot run on GPU "
                    f"{g.index} ({g.name}, sm_{g.sm}); build one for sm_{g.sm} with {INSTALL}"
                )
        return problems

    def problems(self, hw: HardwareProfile | None = None) -> list[str]:
        out: list[str] = []
        if not self.runs:
            out.append(f"it does not run on this machine: {as_clause(self.run_problem)}")
            return out
        if self.loads_k3 is False:
            out.append(f"it cannot load Kimi-K3: {as_clause(self.k3_problem)}")
        if self.accepts_mmproj is False:
            out.append(f"it cannot load a vision projector: {as_clause(self.mmproj_problem)}")
        for flag, loss in FLAGS.items():
            if self.flags and not self.flags.get(flag, False):
                out.append(f"it lacks {flag}: it {loss}")
        out += self.gpu_problems(hw)
        return out

    def verdict(self, hw: HardwareProfile | None = None) -> str:
        """One sentence a person reads first (two when there is something to do)."""
        why = self.reason()
        if not self.runs:
            return f"This engine {why}. {INSTALL} builds one that runs here."
        if self.loads_k3 is False:
            return f"This engine {why}. {INSTALL} builds one that can."
        if why:
            return f"This engine {why}. {INSTALL} builds a newer one."
        gpu = self.gpu_problems(hw)
        if gpu:
            return f"This engine loads Kimi-K3, but {gpu[0]}."
        backend = "/".join(b for b in self.backends if b != "RPC") or "CPU"
        vision = "with images" if self.accepts_mmproj else "text only"
        return f"This engine loads Kimi-K3 ({backend}, {vision})."

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProbeResult:
        d = dict(d)
        for key in ("backends", "devices", "cuda_archs"):
            d[key] = tuple(d.get(key, ()))
        return cls(**d)


def as_clause(text: str) -> str:
    """``text`` to go after a colon: no final period, a leading capital lowered
    ("The engine stopped." -> "the engine stopped"; acronyms stay)."""
    text = text.strip().rstrip(".")
    if text[:1].isupper() and text[1:2].islower():
        text = text[0].lower() + text[1:]
    return text


def cuda_arch_covers(archs: Sequence[str], cc: tuple[int, int]) -> bool:
    """Whether code built for ``archs`` (e.g. "90", "120") runs natively on compute
    capability ``cc``: same major version and a minor no newer than the GPU's."""
    for a in archs:
        digits = re.sub(r"\D", "", a)
        if len(digits) < 2:
            continue
        major, minor = int(digits[:-1]), int(digits[-1])
        if major == cc[0] and minor <= cc[1]:
            return True
    return False


# ------------------------------------------------------------ parsing
_VERSION = re.compile(r"version:\s*(.+?)\s*$", re.MULTILINE)
_BUILD = re.compile(r"\bbuild\s+(\d+)")
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
# "-fit,  --fit [on|off]   whether ...": the flags before the metavar and description
_OPTION_COLUMN = re.compile(r"^\s*((?:--?[A-Za-z][\w-]*(?:,\s*|\s+(?=-)))*--?[A-Za-z][\w-]*)")
_ARCHS = re.compile(r"\bARCHS\s*=\s*([0-9][0-9,; ]*)")


def parse_version(text: str) -> tuple[str, int | None]:
    m = _VERSION.search(text)
    version = m.group(1) if m else (text.strip().splitlines() or [""])[0]
    # "0.6.0-dev (build 0, commit unknown)" (newer) or "4000 (a1b2c3d)" (older)
    b = _BUILD.search(version) or re.match(r"(\d+) \(", version)
    return version, int(b.group(1)) if b else None


def parse_help_flags(text: str) -> set[str]:
    """Every option name in ``--help`` output (the first column of each option line)."""
    flags: set[str] = set()
    for line in text.splitlines():
        m = _OPTION_COLUMN.match(line)
        if m:
            flags.update(_FLAG.findall(m.group(1)))
    return flags


def parse_devices(text: str) -> tuple[str, ...]:
    devices = []
    started = False
    for line in text.splitlines():
        if "Available devices" in line:
            started = True
            continue
        if started and line.strip() and line.strip() != "(none)":
            devices.append(line.strip())
    return tuple(devices)


def parse_cuda_archs(text: str) -> tuple[str, ...]:
    """``CUDA : ARCHS = 890,900,1200`` (from the system_info line) -> ("89", "90", "120")."""
    out: list[str] = []
    for m in _ARCHS.finditer(text):
        for a in re.split(r"[,; ]+", m.group(1).strip()):
            if a.isdigit() and len(a) >= 3:
                v = str(int(a) // 10)
                if v not in out:
                    out.append(v)
    return tuple(out)


def backends_of(executable: Path, devices: Sequence[str]) -> tuple[str, ...]:
    """Compiled-in backends: ggml backend libraries beside the binary plus devices listed."""
    found: list[str] = []
    for lib in sorted(executable.resolve().parent.glob("*ggml-*")):
        m = re.match(r"(?:lib)?ggml-([a-z]+)", lib.name)
        if m and m.group(1) in _LIB_BACKENDS:
            name = _LIB_BACKENDS[m.group(1)]
            if name not in found:
                found.append(name)
    for d in devices:
        m = re.match(r"([A-Za-z]+)\d*\s*:", d)
        if m:
            name = {"ROCM": "ROCm"}.get(m.group(1).upper(), m.group(1))
            name = {"CUDA": "CUDA", "VULKAN": "Vulkan", "METAL": "Metal", "MTL": "Metal"}.get(
                name.upper(), name
            )
            if name not in found:
                found.append(name)
    if "CPU" not in found:
        found.append("CPU")
    order = ["CUDA", "ROCm", "Vulkan", "Metal", "SYCL", "CPU", "RPC"]
    return tuple(sorted(found, key=lambda b: order.index(b) if b in order else len(order)))


# ------------------------------------------------------------ running
class _Step(NamedTuple):
    """One short run of the engine: its exit status (None: it did not finish in time,
    -1000: it could not be started), its output, and what it did that llama-server never
    does ("": nothing), as a clause."""

    rc: int | None
    out: str
    odd: str = ""


def _run(argv: Sequence[str], timeout: float) -> _Step:
    """``argv`` run to its end, its output bounded (b11434's ``--help`` prints 59 kB; one
    that prints more than :data:`OUTPUT_LIMIT` is ended there), and whatever it left
    running ended and said."""
    try:
        p = run_child(
            argv,
            timeout=timeout,
            merge_stderr=True,
            env={**os.environ, **launch_env()},  # --list-devices in NVML's order
            end_past_limit=True,
        )
    except subprocess.TimeoutExpired as exc:
        return _Step(None, exc.stdout if isinstance(exc.stdout, str) else "")
    except OSError as exc:
        return _Step(-1000, str(exc))
    flag = f"`{argv[-1]}`"
    if p.cut_off or p.discarded:
        odd = (
            f"{flag} printed more than {OUTPUT_LIMIT >> 20} MiB and was ended there "
            "(llama-server prints a few lines)"
        )
        return _Step(p.returncode, p.stdout, odd)
    if p.left_running:
        n = len(p.left_running)
        which = ", ".join(str(pid) for pid in p.left_running[:5])
        odd = (
            f"{flag} left {n} process{'es' if n > 1 else ''} running after it ended "
            f"(k3desk ended {'them' if n > 1 else 'it'}: process {which}); "
            "llama-server leaves none"
        )
        return _Step(p.returncode, p.stdout, odd)
    return _Step(p.returncode, p.stdout)


def _cache_path(paths: AppPaths) -> Path:
    return paths.cache / CACHE_FILE


def _cache_key(path: Path, st: os.stat_result) -> str:
    """Path, size and mtime of the executable and of the libraries beside it (PyPI builds
    are a small launcher around libllama-server-impl.so, so the libraries matter)."""
    parts = [f"{path}|{st.st_size}|{st.st_mtime_ns}"]
    with contextlib.suppress(OSError):
        for lib in sorted(path.resolve().parent.iterdir()):
            if ".so" in lib.name or lib.suffix in (".dylib", ".dll"):
                ls = lib.stat()
                parts.append(f"{lib.name}:{ls.st_size}:{ls.st_mtime_ns}")
    if len(parts) == 1:
        return parts[0]
    digest = hashlib.sha256("\n".join(parts[1:]).encode()).hexdigest()[:16]
    return f"{parts[0]}|libs:{digest}"


def _load_cache(paths: AppPaths) -> dict[str, Any]:
    data, _note = load_checked(
        _cache_path(paths), lambda d: check_dict(d, "the cache"), what="engine check cache"
    )
    return data or {}


def _save_cache(paths: AppPaths, key: str, result: ProbeResult | dict[str, Any]) -> None:
    data = _load_cache(paths)
    data[key] = result.to_dict() if isinstance(result, ProbeResult) else result
    write_private(_cache_path(paths), json.dumps(data, indent=1))


def cached_probe(executable: Path, paths: AppPaths) -> ProbeResult | None:
    """The cached result for this exact file (same size and mtime), if any."""
    try:
        st = executable.stat()
    except OSError:
        return None
    raw = _load_cache(paths).get(_cache_key(executable.absolute(), st))
    if not isinstance(raw, dict) or raw.get("schema") != PROBE_SCHEMA:
        return None
    try:
        return ProbeResult.from_dict(raw)
    except TypeError:
        return None


def probe_engine(
    executable: str | Path,
    paths: AppPaths,
    *,
    use_cache: bool = True,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    timeout: float = 60.0,
) -> ProbeResult:
    """Probe ``executable`` (see the module docstring).  Raises EngineError only when
    the file does not exist; every other finding is in the result."""
    exe = Path(executable).expanduser().absolute()
    st = _engine_file(exe)
    if use_cache:
        hit = cached_probe(exe, paths)
        if hit is not None:
            return hit
    key = _cache_key(exe, st)
    base: dict[str, Any] = {"path": str(exe), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def step(n: int, detail: str) -> None:
        if cancel is not None:
            cancel.raise_if_cancelled()
        progress(Progress("probe", n, 5, detail))

    step(0, "--version")
    rc, out, odd = _run([str(exe), "--version"], 20.0)
    if odd or rc is None or rc != 0:
        return _does_not_run(paths, key, base, odd or _version_problem(rc, out))
    version, build = parse_version(out)

    step(1, "--help")
    _, help_text, odd = _run([str(exe), "--help"], 20.0)
    if odd:
        return _does_not_run(paths, key, base, odd)
    known = parse_help_flags(help_text)
    flags = {f: f in known for f in FLAGS}

    step(2, "--list-devices")
    _, dev_text, odd = _run([str(exe), "--list-devices"], 30.0)
    if odd:
        return _does_not_run(paths, key, base, odd)
    devices = parse_devices(dev_text)
    backends = backends_of(exe, devices)

    step(3, "loading a tiny Kimi-K3 canary")
    for _ in range(CANARY_TRIES):
        canary = _probe_canary(exe, paths, flags, VERBOSITY.name in known, timeout, cancel)
        if canary.established:
            break
    step(5, "done")
    result = ProbeResult(
        **base,
        runs=canary.runs,
        run_problem=canary.run_problem,
        version=version,
        build_number=build,
        flags=flags,
        backends=backends,
        devices=devices,
        cuda_archs=canary.cuda_archs,
        loads_k3=canary.loads_k3,
        k3_problem=canary.k3_problem,
        accepts_mmproj=canary.accepts_mmproj,
        mmproj_problem=canary.mmproj_problem,
        load_seconds=canary.load_seconds,
        probed_at=time.time(),
    )
    if canary.established:
        _save_cache(paths, key, result)
    return result


def _does_not_run(paths: AppPaths, key: str, base: dict[str, Any], problem: str) -> ProbeResult:
    result = ProbeResult(**base, runs=False, run_problem=problem, probed_at=time.time())
    _save_cache(paths, key, result)
    return result


def _engine_file(exe: Path) -> os.stat_result:
    """``exe``'s status, once it is an executable regular file (EngineError otherwise:
    a named pipe, a device or a socket is named, never opened or run)."""
    try:
        st = exe.stat()
    except OSError as exc:
        raise EngineError(
            f"Engine {exe} does not exist.", "Run `k3desk engine list` to see the engines found."
        ) from exc
    if not stat.S_ISREG(st.st_mode):
        raise EngineError(
            f"Engine {exe} is {mode_kind(st.st_mode)}, not a program.",
            "Choose the llama-server executable itself.",
        )
    if not os.access(exe, os.X_OK):
        raise EngineError(f"Engine {exe} is not executable.", f"Run `chmod +x {exe}`.")
    return st


def _version_problem(rc: int | None, out: str) -> str:
    """Why ``--version`` failed (exit ``rc``, None: it did not finish), as a clause."""
    if rc is None:
        return "`--version` did not finish within 20 s"
    if rc == -1000:
        return f"it cannot be executed ({out.strip()})"
    crash = classify_exit(rc, out.splitlines())
    if crash.kind == "illegal_instruction":
        return "it dies with an illegal instruction (built for another CPU)"
    return crash.summary


# Crashes that say nothing about the engine: the port was taken by another program
# during the check, the machine was short of memory or time, something killed it.  A
# verdict is remembered only from a check that completed against the process k3desk
# started; these are tried again, and never cached.
TRANSIENT = frozenset({"port_in_use", "load_timeout", "oom_killed", "killed"})
CANARY_TRIES = 3


@dataclass
class _Canary:
    established: bool = True  # False: a transient failure; the result is not cached
    runs: bool = True
    run_problem: str = ""
    loads_k3: bool | None = None
    k3_problem: str = ""
    accepts_mmproj: bool | None = None
    mmproj_problem: str = ""
    cuda_archs: tuple[str, ...] = ()
    load_seconds: float | None = None


def _probe_canary(
    exe: Path,
    paths: AppPaths,
    flags: dict[str, bool],
    verbose_flag: bool,
    timeout: float,
    cancel: CancelToken | None,
) -> _Canary:
    result = _Canary()
    with tempfile.TemporaryDirectory(prefix="k3desk-canary-") as tmp:
        d = Path(tmp)
        model = write_k3_gguf(d, "k3-canary", shape=TINY_K3, seed=7)[0]
        proj = write_mlp_projector(d / "mmproj-k3-canary-F16.gguf", TINY_K3.n_embd, seed=8)
        with_mmproj = flags.get(MMPROJ.name, True)
        # level 4 prints system_info, where a CUDA build lists its ARCHS
        verbosity = 4 if verbose_flag else None
        args = canary_args(model, verbosity=verbosity)  # without the projector
        first = canary_args(model, mmproj=proj, verbosity=verbosity) if with_mmproj else args
        sup = _serve(exe, paths, first, timeout)
        try:
            ok, vision = _wait_canary(sup, cancel)
            result.cuda_archs = parse_cuda_archs("\n".join(sup.tail()))
            if ok:
                result.loads_k3 = True
                result.load_seconds = sup.history[0].ready_seconds
                if with_mmproj:
                    result.accepts_mmproj = vision
                    if not vision:
                        result.mmproj_problem = "the server did not report vision support"
                return result
        finally:
            sup.stop()
        crash = sup.last_crash
        why = crash.summary if crash else "it stopped before it was ready"
        kind = crash.kind if crash else "exited"
        if kind in TRANSIENT:
            result.established = False
            result.k3_problem = f"the check could not finish ({as_clause(why)})"
            return result
        if kind == "illegal_instruction":
            result.runs = False
            result.run_problem = (
                "it dies with an illegal instruction while loading (built for another CPU)"
            )
            return result
        if kind == "unknown_architecture":
            result.loads_k3 = False
            result.k3_problem = "it predates kimi-k3 support"
            if crash is not None and "'kimi-k3'" not in crash.evidence:
                result.k3_problem = why
            return result
        if with_mmproj and kind == "unsupported_projector":
            result.accepts_mmproj = False
            result.mmproj_problem = why
            sup = _serve(exe, paths, args, timeout)
            try:
                ok, _ = _wait_canary(sup, cancel)
                result.cuda_archs = result.cuda_archs or parse_cuda_archs("\n".join(sup.tail()))
                result.loads_k3 = ok
                if ok:
                    result.load_seconds = sup.history[0].ready_seconds
                else:
                    c2 = sup.last_crash
                    result.k3_problem = c2.summary if c2 else "it stopped before it was ready"
                    if c2 is not None and c2.kind in TRANSIENT:
                        result.established = False
                        result.loads_k3 = None
            finally:
                sup.stop()
            return result
        result.loads_k3 = False
        result.k3_problem = why
        return result


@dataclass(frozen=True)
class ProjectorCheck:
    """Whether an engine knows a vision projector type (``clip.projector_type``)."""

    projector_type: str
    known: bool
    detail: str  # what the engine said, in words


_UNKNOWN_PROJECTOR = re.compile(r"unknown projector type:\s*(\S+)")


def probe_projector(
    executable: str | Path,
    paths: AppPaths,
    projector_type: str,
    *,
    use_cache: bool = True,
    cancel: CancelToken | None = None,
    timeout: float = 60.0,
) -> ProjectorCheck:
    """Does ``executable`` know the projector type of a tier's mmproj (e.g. ``kimik3``)?

    It serves the canary with a small projector of that type.  A clip loader that does
    not know the type says "unknown projector type: X" and exits (tools/mtmd/clip.cpp,
    ``load_hparams``); that is the answer no.  One that knows it goes on to the
    projector's tensors, which a canary cannot have for every type: any other outcome
    means it knows the type.  Cached like :func:`probe_engine`.
    """
    exe = Path(executable).expanduser().absolute()
    st = _engine_file(exe)
    key = f"{_cache_key(exe, st)}|mmproj:{projector_type}"
    if use_cache:
        hit = _load_cache(paths).get(key)
        if isinstance(hit, dict) and hit.get("schema") == PROBE_SCHEMA:
            return ProjectorCheck(projector_type, bool(hit.get("known")), str(hit.get("detail")))
    with tempfile.TemporaryDirectory(prefix="k3desk-projector-") as tmp:
        d = Path(tmp)
        model = write_k3_gguf(d, "k3-canary", shape=TINY_K3, seed=7)[0]
        proj = write_mlp_projector(
            d / f"mmproj-{projector_type}.gguf", TINY_K3.n_embd, seed=8,
            projector_type=projector_type,
        )  # fmt: skip
        for _ in range(CANARY_TRIES):
            sup = _serve(exe, paths, canary_args(model, mmproj=proj), timeout)
            try:
                ready, _ = _wait_canary(sup, cancel)
            finally:
                sup.stop()
            crash = sup.last_crash
            transient = not ready and crash is not None and crash.kind in TRANSIENT
            if not transient:
                break
        text = "\n".join(sup.tail())
    m = _UNKNOWN_PROJECTOR.search(text)
    if m and m.group(1).strip("'\"") == projector_type:
        check = ProjectorCheck(
            projector_type, False, f"it does not know the {projector_type!r} vision projector"
        )
    elif ready:
        check = ProjectorCheck(projector_type, True, f"it loads a {projector_type!r} projector")
    else:
        check = ProjectorCheck(
            projector_type, True, f"it knows the {projector_type!r} vision projector"
        )
    if not transient:
        cached = {"schema": PROBE_SCHEMA, "known": check.known, "detail": check.detail}
        _save_cache(paths, key, cached)
    return check


def _serve(exe: Path, paths: AppPaths, args: Sequence[str], timeout: float) -> Supervisor:
    spec = LaunchSpec(exe, tuple(args), ready_timeout=timeout)
    sup = Supervisor(spec, paths, policy=RestartPolicy(max_failures=1, stop_grace=5.0))
    sup.start()
    return sup


def _wait_canary(sup: Supervisor, cancel: CancelToken | None) -> tuple[bool, bool]:
    """(ready, vision reported) for a canary server."""
    try:
        ep = sup.wait_ready(cancel=cancel)
    except Cancelled:
        raise
    except EngineError:
        return False, False
    vision = False
    # keyed: only to the canary process, over a connection it accepted
    got = keyed_get(ep.pid, ep.port, "/props", ep.api_key, timeout=5.0)
    if got is not None and got[0] == 200:
        with contextlib.suppress(ValueError, AttributeError, RecursionError):
            props = json.loads(got[1])
            vision = bool((props.get("modalities") or {}).get("vision"))
    return True, vision
