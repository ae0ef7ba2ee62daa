"""This machine's CPU against the one the shipped kernel costs were measured on.

``resources/kernels.json`` holds llama.cpp's own kernel costs as
``bench/kernel_costs.py`` measured them on one machine. Machines sold under one CPU
name differ from it by two times and more: the same "AMD EPYC, 2 cores" decoded a
Q8_0 model at 0.091 ns per weight on one day's machine and at 0.0425 on the next
day's, so every prediction made here from the shipped costs was 29-63 % low.

The probe runs the engine's own kernels here on the model those costs were measured
with -- a dense kimi-k3 whose every matrix is Q8_0 (:data:`PROBE_SHAPE`, about 0.6 G
weights: far more than any cache; ``k3desk.core.k3arch.KERNEL_K3``) --
through ``llama-bench`` beside the chosen llama-server, on one thread and on the
threads a plan uses (and the same for F16 and Q4_K models), in rounds (the median of
the rounds: a busy moment moves one round, not the answer). The speed model predicts
the same runs from the shipped costs and this machine's RAM bandwidth; the factor
that makes its prediction meet each measured speed, per test (decoding, prompts) and
thread count, scales every cost
(:meth:`k3desk.core.planning.kernels.Kernels.scaled`). So a plan's speed on this
machine rests on its own kernels before any model was run here; runs made later
still correct it (:mod:`calibration`).

Three types are timed (:data:`PROBE_TYPES`): Q8_0 for every cost, F16 and Q4_K for
their own matrices. It takes about three minutes on two cores and 2.6 GB of the
cache folder while it runs (the F16 source, its Q8_0 and Q4_K), all deleted after.
The result is kept in the state folder (``cpu-probe.json``) for this machine, this
engine build and these shipped costs; any of the three changing makes it stale.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from k3desk.core.engines.canary import write_k3_gguf_streamed
from k3desk.core.errors import Cancelled, EngineError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.k3arch import KERNEL_K3, K3Shape
from k3desk.core.localfiles import (
    check_dict,
    check_float,
    check_int,
    check_text,
    check_when,
    load_checked,
)
from k3desk.core.planning import kernels as kernel_costs
from k3desk.core.planning.model import LaunchPlan, PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.planning.speed import default_threads, predict_speed
from k3desk.core.private import private_dir, write_private
from k3desk.core.process import spawn
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress
from k3desk.core.tuning.identity import is_this_machine, machine_key
from k3desk.core.units import fmt_bytes

PROBE_FILE = "cpu-probe.json"
SCHEMA = 1
# the dense model the shipped per-type costs were measured on (bench/kernel_costs.py)
PROBE_SHAPE = KERNEL_K3
PROBE_TYPE = "Q8_0"
# the prompt and generation lengths of bench/kernel_costs.py (PP, TG)
PROMPT_TOKENS, GEN_TOKENS = 64, 32
ROUNDS = 3
REPETITIONS = 2  # llama-bench's -r per round
# The types timed: Q8_0 gives the general factor (every cost: nodes, the layers' own
# operations, types not timed), F16 and Q4_K their own and their families' (the float
# path, the k-quants: kernels.SCALE_FAMILY).  Machines differ by type: on one "AMD
# EPYC" the shipped Q8_0 decode cost held within 6 % while F16 and the k-quants ran
# 20-30 % faster.  F16 is the source the others are quantized from: timing it is free.
PROBE_TYPES = ("Q8_0", "F16", "Q4_K")
# the F16 source (1.2 GB), its Q8_0 (0.64 GB) and Q4_K (0.36 GB), with room to spare
DISK_NEEDED = 2_600_000_000
# a factor outside this is a broken run, not a CPU (the two machines above: 0.47)
FACTOR_RANGE = (1 / 16, 16.0)
BENCH_TIMEOUT = 600.0


@dataclass(frozen=True)
class ProbeRun:
    """One thread count's measured speeds (tok/s) and the factors they give."""

    threads: int
    prompt_tps: float
    decode_tps: float
    prompt_factor: float  # this machine's time / the shipped costs' time
    decode_factor: float
    spread: float  # (max - min) / median of the rounds' decode speeds
    type_name: str = PROBE_TYPE  # the probe model's matrix type


@dataclass(frozen=True)
class CpuProbe:
    machine: str  # identity.machine_key
    engine: str  # the llama-bench it ran: path, size, modification time
    costs: str  # the shipped costs it scales (Kernels.source)
    when: float
    ram_bps: float  # the RAM bandwidth the predictions used
    runs: tuple[ProbeRun, ...]

    def scale(self) -> kernel_costs.KernelScale:
        def table(runs: Sequence[ProbeRun]) -> dict[str, dict[int, float]]:
            return {
                "tg": {r.threads: r.decode_factor for r in runs},
                "pp": {r.threads: r.prompt_factor for r in runs},
            }

        general = [r for r in self.runs if r.type_name == PROBE_TYPE]
        names = sorted({r.type_name for r in self.runs} - {PROBE_TYPE})
        types = {t: table([r for r in self.runs if r.type_name == t]) for t in names}
        return kernel_costs.KernelScale(table(general), note=self.note(), types=types)

    def general(self) -> ProbeRun:
        """The Q8_0 run on the most threads (what the summaries quote)."""
        runs = [r for r in self.runs if r.type_name == PROBE_TYPE] or list(self.runs)
        return max(runs, key=lambda r: r.threads)

    @property
    def day(self) -> str:
        return time.strftime("%Y-%m-%d", time.localtime(self.when))

    def note(self) -> str:
        """'scaled to this CPU's kernels, timed here on 2026-12-02 (1 thread: decoding
        0.47x, prompts 0.52x; ...)': the time this CPU takes against the costs' machine."""
        parts = [
            f"{r.type_name} {r.threads} thread{'s' if r.threads > 1 else ''}: "
            f"decoding {r.decode_factor:.2f}x, prompts {r.prompt_factor:.2f}x"
            for r in self.runs
        ]
        return f"scaled to this CPU's kernels, timed here on {self.day} ({'; '.join(parts)})"

    def sentence(self) -> str:
        """The plan's note: the speeds rest on this CPU's own kernel timings."""
        speed = 1.0 / self.general().decode_factor
        return (
            f"CPU speeds are predicted with this CPU's own kernel timings (checked on "
            f"{self.day}: it decodes at {speed:.2f}x the speed of the machine the "
            "costs were measured on)."
        )


# ------------------------------------------------------------------ the tools


def probe_tools(server: Path) -> tuple[Path, Path]:
    """``llama-bench`` and ``llama-quantize`` of the same build as ``server`` (beside it).

    Raises EngineError saying which is missing: a build that ships only llama-server
    cannot be probed, and its predictions keep the shipped costs."""
    folder = server.parent
    found = []
    for name in ("llama-bench", "llama-quantize"):
        path = folder / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise EngineError(
                f"{name} is not beside {server}: the CPU check needs the engine's own "
                f"{name} of the same build.",
                hint="Build llama.cpp with its tools (the default), or install the engine "
                "with `k3desk engine install`.",
            )
        found.append(path)
    return found[0], found[1]


def file_identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _run(
    argv: Sequence[str | os.PathLike[str]], what: str, cancel: CancelToken, timeout: float
) -> str:
    """``argv``'s standard output; Cancelled when ``cancel`` is set meanwhile (the child
    is stopped), EngineError with the end of its error output when it fails."""
    child = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stop = threading.Event()

    def on_cancel() -> None:
        if not stop.is_set():
            child.stop(2.0)

    cancel.on_cancel(on_cancel)
    try:
        out, err = child.popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.stop(2.0)
        raise EngineError(f"{what} took longer than {timeout:.0f} s and was stopped.") from None
    except BaseException:
        child.stop(2.0)
        raise
    finally:
        stop.set()
        child.close_pipes()
    child.finish()
    if cancel.cancelled:
        raise Cancelled()
    if child.popen.returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise EngineError(
            f"{what} failed (exit status {child.popen.returncode}): " + " / ".join(tail)
        )
    return bytes(out).decode("utf-8", "replace")


def write_probe_models(
    work: Path,
    quantize: Path,
    *,
    threads: int,
    cancel: CancelToken,
    shape: K3Shape = PROBE_SHAPE,
    types: Sequence[str] = PROBE_TYPES,
) -> dict[str, Path]:
    """The probe models in ``work``, by type: the F16 source, and ``llama-quantize
    --pure`` of it to each other type (the source is deleted unless F16 is one of
    ``types``).  Nothing is left behind when it fails or is cancelled."""
    private_dir(work)
    free = shutil.disk_usage(work).free
    if free < DISK_NEEDED:
        raise EngineError(
            f"The CPU check needs {fmt_bytes(DISK_NEEDED)} free in {work} for a moment "
            f"and {fmt_bytes(free)} is free."
        )
    src = work / "probe-f16.gguf"
    models: dict[str, Path] = {}
    try:
        write_k3_gguf_streamed(src, "k3desk cpu probe", shape=shape)
        for t in types:
            cancel.raise_if_cancelled()
            if t == "F16":
                models[t] = src
                continue
            out = work / f"probe-{t.lower()}.gguf"
            models[t] = out
            _run(
                [quantize, "--pure", src, out, t, str(max(1, threads))],
                "llama-quantize",
                cancel,
                BENCH_TIMEOUT,
            )
    except BaseException:
        remove_models(models.values())
        raise
    finally:
        if "F16" not in models:
            with contextlib.suppress(OSError):
                src.unlink()
    return models


@contextlib.contextmanager
def sole_check(work: Path) -> Iterator[None]:
    """Hold ``work`` for one CPU check: refused (EngineError) while another process's
    check holds it, and cleared of the probe models a check that was killed mid-way
    (kill -9, a power cut) left there.  The hold is the kernel's lock on the folder
    (flock): it ends with the process that took it, however that ends, so a folder
    held by nobody has nobody writing in it."""
    private_dir(work)
    fd = os.open(work, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EngineError(
                "A CPU check is already running on this machine (another k3desk window "
                "or command).",
                hint="Wait for it to end: two at once would each time the other's load.",
            ) from None
        remove_models(work.glob("probe-*"))
        yield
    finally:
        os.close(fd)


def remove_models(paths: Iterable[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


def bench_once(bench: Path, model: Path, threads: int, cancel: CancelToken) -> tuple[float, float]:
    """One ``llama-bench`` run: prompt and decode tok/s (the median of its repetitions)."""
    argv: list[str | os.PathLike[str]] = [
        bench, "-m", model, "-t", str(threads), "-p", str(PROMPT_TOKENS),
        "-n", str(GEN_TOKENS), "-r", str(REPETITIONS), "-fa", "1", "-o", "json",
        # the CPU, also in a GPU build: llama-bench's defaults put every layer on the
        # GPU (-ngl -1) and send a prompt's large matrices there (op offload)
        "-ngl", "0", "-dev", "none", "-nopo", "1",
    ]  # fmt: skip
    text = _run(argv, "llama-bench", cancel, BENCH_TIMEOUT)
    return parse_bench(text)


def parse_bench(text: str) -> tuple[float, float]:
    """Prompt and decode tok/s from ``llama-bench -o json``'s output."""
    try:
        rows = json.loads(text)
        speeds: dict[str, float] = {}
        for row in rows:
            test = "pp" if int(row["n_prompt"]) > 0 else "tg"
            samples = [float(x) for x in row.get("samples_ts") or [row["avg_ts"]]]
            speeds[test] = statistics.median(samples)
        pp, tg = speeds["pp"], speeds["tg"]
    except (ValueError, TypeError, KeyError, statistics.StatisticsError) as exc:
        raise EngineError(
            f"llama-bench printed no speeds k3desk can read ({exc!r:.120})."
        ) from None
    if not (0 < pp < 1e9 and 0 < tg < 1e9 and math.isfinite(pp) and math.isfinite(tg)):
        raise EngineError(f"llama-bench printed speeds no run gives ({pp!r}, {tg!r}).")
    return pp, tg


# ------------------------------------------------------------------ the factors


def predicted(
    hw: HardwareProfile,
    layout: ModelLayout,
    threads: int,
    k: kernel_costs.Kernels | None,
    *,
    plan: LaunchPlan | None = None,
    prompt_tokens: int = PROMPT_TOKENS,
    gen_tokens: int = GEN_TOKENS,
) -> tuple[float, float]:
    """Prompt and decode tok/s of a ``llama-bench`` run of ``layout`` (``-p prompt_tokens
    -n gen_tokens -t threads``) as k3desk predicts it with the costs ``k`` (None: as
    shipped); ``plan``: the plan for it already made (the predictions differ only in
    their costs)."""
    if plan is None:
        plan = make_plan(hw, layout, PlanOptions(ctx=4096, threads=threads))
    s = predict_speed(
        hw,
        layout,
        plan.layers,
        plan.output_device,
        ctx=plan.ctx,
        depth=gen_tokens // 2,  # tg from an empty context: half its tokens deep on average
        threads=threads,
        prompt_tokens=prompt_tokens,
        kernels=k,
    )
    return s.prompt_tps, s.expected_tps


def solve_factor(measured_tps: float, speed_at: Callable[[float], float]) -> float:
    """The factor ``f`` with ``speed_at(f) == measured_tps``, ``speed_at`` falling with
    ``f`` (bisection on log f within :data:`FACTOR_RANGE`).

    A run faster than any factor predicts is bound by the RAM bandwidth in the
    prediction (the bandwidth reading was low, or the kernels hide their reads): the
    kernels then are at least as fast as where the bandwidth starts to bind, and are
    taken as the shipped costs say unless that is slower (``min(1, knee)``); a
    run slower than any factor predicts takes the top of the range."""
    lo, hi = math.log(FACTOR_RANGE[0]), math.log(FACTOR_RANGE[1])
    fastest = speed_at(FACTOR_RANGE[0])
    if measured_tps >= fastest:
        for _ in range(48):  # the knee: the largest f still predicting the fastest speed
            mid = (lo + hi) / 2
            if speed_at(math.exp(mid)) >= fastest * (1 - 1e-9):
                lo = mid
            else:
                hi = mid
        return min(1.0, math.exp(lo))
    for _ in range(48):
        mid = (lo + hi) / 2
        if speed_at(math.exp(mid)) > measured_tps:
            lo = mid  # predicted too fast: the kernels take longer here
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def factors(
    hw: HardwareProfile,
    layout: ModelLayout,
    threads: int,
    prompt_tps: float,
    decode_tps: float,
    k: kernel_costs.Kernels,
    type_name: str = "",
) -> tuple[float, float]:
    """The prompt and decode factors that make the prediction at ``threads`` meet the
    measured speeds: of every cost, or with ``type_name`` of that type's matrices alone
    (``k`` then carries the general factors: the probe model's nodes and layer
    operations).  Decoding first: its prediction rests on the matrix-vector costs alone,
    while a prompt's also pays them (a matrix's once-per-batch part, routed experts of
    few tokens), so the prompt factor is found with the decode factor in."""
    base = k.scale or kernel_costs.KernelScale({})
    plan = make_plan(hw, layout, PlanOptions(ctx=4096, threads=threads))

    def at(tg: float, pp: float) -> tuple[float, float]:
        own = {"tg": {threads: tg}, "pp": {threads: pp}}
        if type_name:
            scale = kernel_costs.KernelScale(base.factors, types={**base.types, type_name: own})
        else:
            scale = kernel_costs.KernelScale(own)
        return predicted(hw, layout, threads, k.scaled(scale), plan=plan)

    tg = solve_factor(decode_tps, lambda f: at(f, base.at("pp", threads))[1])
    pp = solve_factor(prompt_tps, lambda f: at(tg, f)[0])
    return pp, tg


def _spread(values: Sequence[float]) -> float:
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else 0.0


def _time_models(
    bench: Path,
    models: dict[str, Path],
    counts: Sequence[int],
    rounds: int,
    token: CancelToken,
    progress: ProgressCallback,
) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """Every model at every thread count once per round: (prompt, decode) tok/s."""
    speeds: dict[tuple[str, int], list[tuple[float, float]]] = {}
    steps = 1 + rounds * len(counts) * len(models)
    done = 1
    for r in range(rounds):
        for n in counts:
            for t, model in models.items():
                token.raise_if_cancelled()
                threads = f"{n} thread{'s' if n > 1 else ''}"
                detail = f"round {r + 1} of {rounds}, {t}, {threads}"
                progress(Progress("Timing the engine's kernels", done, steps, detail))
                speeds.setdefault((t, n), []).append(bench_once(bench, model, n, token))
                done += 1
    return speeds


def _runs(
    hw: HardwareProfile,
    models: dict[str, Path],
    speeds: dict[tuple[str, int], list[tuple[float, float]]],
    counts: Sequence[int],
    k: kernel_costs.Kernels,
) -> list[ProbeRun]:
    """The factors of the measured speeds: Q8_0's general ones first, then each other
    type's own with the general ones in."""
    runs: list[ProbeRun] = []
    general: dict[str, dict[int, float]] = {"tg": {}, "pp": {}}
    order = [PROBE_TYPE, *[t for t in models if t != PROBE_TYPE]]
    for t in [t for t in order if t in models]:
        layout = validate_shard_set(models[t])
        for n in counts:
            got = speeds[(t, n)]
            pp = statistics.median(x[0] for x in got)
            tg = statistics.median(x[1] for x in got)
            if t == PROBE_TYPE:
                f_pp, f_tg = factors(hw, layout, n, pp, tg, k)
                general["tg"][n], general["pp"][n] = f_tg, f_pp
            else:
                base = k.scaled(kernel_costs.KernelScale(general))
                f_pp, f_tg = factors(hw, layout, n, pp, tg, base, t)
            runs.append(ProbeRun(n, pp, tg, f_pp, f_tg, _spread([x[1] for x in got]), t))
    return runs


def run_cpu_probe(
    server: Path,
    hw: HardwareProfile,
    work: Path,
    *,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    kernels: kernel_costs.Kernels | None = None,
    clock: Callable[[], float] = time.time,
    shape: K3Shape = PROBE_SHAPE,
    rounds: int = ROUNDS,
    types: Sequence[str] = PROBE_TYPES,
) -> CpuProbe:
    """Time the engine's kernels on this machine (see the module docstring).

    ``hw`` should carry a measured RAM bandwidth (the predictions it is compared with
    use it).  Raises EngineError (a tool missing or failing, too little disk) or
    Cancelled; leaves nothing behind in ``work`` either way.  ``shape``, ``rounds``
    and ``types`` are for tests (a smaller model says less of the kernels)."""
    token = cancel or CancelToken()
    bench, quantize = probe_tools(server)
    k = kernels or kernel_costs.load()
    counts = sorted({1, default_threads(hw)})
    steps = 1 + rounds * len(counts) * len(types)
    with sole_check(work):
        progress(Progress("Writing the probe models", 0, steps, f"{', '.join(types)}, in {work}"))
        models = write_probe_models(
            work, quantize, threads=default_threads(hw), cancel=token, shape=shape, types=types
        )
        try:
            speeds = _time_models(bench, models, counts, rounds, token, progress)
            runs = _runs(hw, models, speeds, counts, k)
        finally:
            remove_models(models.values())
    progress(Progress("Timing the engine's kernels", steps, steps, "done"))
    return CpuProbe(
        machine=machine_key(hw),
        engine=file_identity(bench),
        costs=k.source,
        when=clock(),
        ram_bps=hw.memory.bandwidth.bytes_per_s,
        runs=tuple(runs),
    )


# ------------------------------------------------------------------ the record


def _parse(data: Any) -> list[CpuProbe]:
    d = check_dict(data, "the file")
    if d.get("schema") != SCHEMA:
        raise ValueError("not a CPU check file of this version")
    items = d.get("probes")
    if not isinstance(items, list) or len(items) > 16:
        raise ValueError("probes must be a list of at most 16")
    out = []
    for item in items:
        p = check_dict(item, "probe")
        raw_runs = p.get("runs")
        if not isinstance(raw_runs, list) or not 1 <= len(raw_runs) <= 8:
            raise ValueError("runs must be a list of 1 to 8")
        runs = []
        for raw in raw_runs:
            r = check_dict(raw, "run")
            runs.append(
                ProbeRun(
                    threads=check_int(r.get("threads"), "threads", 1, 1 << 16),
                    prompt_tps=check_float(r.get("prompt_tps"), "prompt_tps", 1e-6, 1e9),
                    decode_tps=check_float(r.get("decode_tps"), "decode_tps", 1e-6, 1e9),
                    prompt_factor=check_float(r.get("prompt_factor"), "factor", *FACTOR_RANGE),
                    decode_factor=check_float(r.get("decode_factor"), "factor", *FACTOR_RANGE),
                    spread=check_float(r.get("spread"), "spread", 0.0, 1e3),
                    type_name=_check_type(r.get("type_name", PROBE_TYPE)),
                )
            )
        out.append(
            CpuProbe(
                machine=check_text(p.get("machine"), "machine", 200),
                engine=check_text(p.get("engine"), "engine"),
                costs=check_text(p.get("costs"), "costs"),
                when=check_when(p.get("when")),
                ram_bps=check_float(p.get("ram_bps"), "ram_bps", 0.0, 1e15),
                runs=tuple(runs),
            )
        )
    return out


def _check_type(value: Any) -> str:
    name = check_text(value, "type_name", 16)
    if name not in PROBE_TYPES:
        raise ValueError(f"type_name must be one of {', '.join(PROBE_TYPES)}, not {name!r:.20}")
    return name


class CpuProbeStore:
    """The CPU checks kept in the state folder, one per machine and engine build."""

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = state_dir / PROBE_FILE
        self._clock = clock
        self.note = ""  # set when a damaged file was set aside

    def probes(self) -> list[CpuProbe]:
        out, note = load_checked(self.path, _parse, what="CPU check record", clock=self._clock)
        if note:
            self.note = note
        return out or []

    def get(
        self, hw: HardwareProfile, kernels: kernel_costs.Kernels | None = None
    ) -> CpuProbe | None:
        """The latest check of this machine against these shipped costs whose engine
        build is still there as it was (None: none, or ``hw`` is another machine)."""
        if not is_this_machine(hw):
            return None
        source = (kernels or kernel_costs.load()).source
        here = [
            p
            for p in self.probes()
            if p.machine == machine_key(hw) and p.costs == source and _same_file(p.engine)
        ]
        return max(here, key=lambda p: p.when) if here else None

    def put(self, probe: CpuProbe) -> None:
        """Keep ``probe``, replacing an older one of the same machine and engine."""
        kept = [
            p
            for p in self.probes()
            if not (p.machine == probe.machine and p.engine == probe.engine)
        ]
        records = [*kept, probe][-16:]
        payload = {"schema": SCHEMA, "probes": [asdict(p) for p in records]}
        write_private(self.path, json.dumps(payload, indent=1) + "\n")


def _same_file(identity: str) -> bool:
    path = identity.rsplit("|", 2)[0]
    try:
        return file_identity(Path(path)) == identity
    except OSError:
        return False


def kept_scale(
    state_dir: Path | None, hw: HardwareProfile
) -> tuple[kernel_costs.KernelScale | None, float]:
    """The kernel scale this machine's latest CPU check gives (None: no check, no state
    folder, or ``hw`` is another machine) and when it was made (0.0: never): plans are
    predicted with the scale, and only runs made since correct them."""
    if state_dir is None:
        return None, 0.0
    probe = CpuProbeStore(state_dir).get(hw)
    return (probe.scale(), probe.when) if probe is not None else (None, 0.0)
