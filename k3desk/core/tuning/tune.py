"""``k3desk tune``: try a few launch variants, measure each, keep the fastest that fits.

The variants are a small, bounded grid around the plan (:func:`candidates`):
threads for decoding (``-t``) and for prompts (``-tb``), batch / micro-batch
pairs (``-b``/``-ub``), and on GPU machines ``--n-cpu-moe`` one step either way
and the projector on the other side.  Each must fit (the planner's memory
check).  Every variant is scored by the time of one fixed test request (a
``prompt_tokens`` prompt and a ``decode_tokens`` answer):

    seconds = prompt_tokens / prompt tok/s + decode_tokens / decode tok/s

Measuring every variant is what an exhaustive sweep does; the tuner measures a
tenth of them, chosen with the speed model (:func:`choose`): the plan's own
default, llama.cpp's defaults for the same model (the reference a user would
otherwise have), and for each decoding setup (``-t``, ``--n-cpu-moe``,
projector) the variant the model predicts fastest, best groups first.  Thread
counts are measured rather than trusted to the model because the model cannot
see what else the machine runs, nor SMT or NUMA effects.  What wins is what was
measured, never what was predicted.

A measurement (:class:`ServerMeasure`) starts the real llama-server with the
variant's arguments under the :class:`Supervisor`, sends a short warm-up
request, then the test request ``repeats`` times (``/completion`` with a fixed
list of token ids, no prompt cache), and keeps the best of the repeats
(interference only ever slows a run down).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from k3desk.core.catalog.model import Tier
from k3desk.core.engines.launch import HardwareSource, PreparedLaunch, prepare_launch
from k3desk.core.engines.supervisor import LaunchSpec, RestartPolicy, Supervisor
from k3desk.core.errors import Cancelled, EngineError, K3Error, PlanError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.validate import inspect_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import AppPaths
from k3desk.core.planning.argv import BATCH, UBATCH, engine_defaults_args, without
from k3desk.core.planning.model import LaunchPlan, PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.planning.speed import default_threads
from k3desk.core.progress import CancelToken, Progress, ProgressCallback, no_progress
from k3desk.core.tuning import DECODE_TOKENS, PROMPT_TOKENS
from k3desk.core.tuning.identity import is_this_machine
from k3desk.core.tuning.tuned import TunedChoice, TunedStore
from k3desk.core.units import fmt_tps3

# (-b, -ub) pairs; llama.cpp's default is (2048, 512)
BATCH_PAIRS: tuple[tuple[int, int], ...] = (
    (2048, 512), (2048, 1024), (2048, 2048), (2048, 256), (2048, 128), (2048, 64),
    (1024, 1024), (1024, 512), (1024, 256), (512, 512), (512, 256), (512, 128),
    (256, 256), (256, 128), (128, 128),
)  # fmt: skip
LLAMA_DEFAULT_BATCH = (2048, 512)


@dataclass(frozen=True)
class Variant:
    """Launch settings on top of the plan; None = as the plan (or llama.cpp) has it."""

    threads: int | None = None
    threads_batch: int | None = None
    batch: int | None = None
    ubatch: int | None = None
    n_cpu_moe: int | None = None
    mmproj_on_cpu: bool | None = None
    # llama.cpp's own defaults: only the model and the context, nothing of the plan
    engine_defaults: bool = False

    def label(self) -> str:
        if self.engine_defaults:
            return "llama.cpp's defaults"
        parts = []
        for flag, value in (
            ("-t", self.threads), ("-tb", self.threads_batch), ("-b", self.batch),
            ("-ub", self.ubatch), ("--n-cpu-moe", self.n_cpu_moe),
        ):  # fmt: skip
            if value is not None:
                parts.append(f"{flag} {value}")
        if self.mmproj_on_cpu is not None:
            parts.append("projector in RAM" if self.mmproj_on_cpu else "projector on the GPU")
        return " ".join(parts) or "the plan's default"

    def options(self, base: PlanOptions) -> PlanOptions:
        return replace(
            base,
            threads=self.threads if self.threads is not None else base.threads,
            threads_batch=(
                self.threads_batch if self.threads_batch is not None else base.threads_batch
            ),
            batch=self.batch if self.batch is not None else base.batch,
            ubatch=self.ubatch if self.ubatch is not None else base.ubatch,
            n_cpu_moe=self.n_cpu_moe if self.n_cpu_moe is not None else base.n_cpu_moe,
            mmproj_on_cpu=(
                self.mmproj_on_cpu if self.mmproj_on_cpu is not None else base.mmproj_on_cpu
            ),
        )

    def decode_group(self) -> tuple[object, ...]:
        """What decoding depends on (batch sizes and prompt threads do not matter)."""
        return (self.threads, self.n_cpu_moe, self.mmproj_on_cpu, self.engine_defaults)


@dataclass(frozen=True)
class Measurement:
    prompt_tps: float = 0.0
    decode_tps: float = 0.0
    wall_s: float = 0.0  # what measuring it took (start, load, requests, stop)
    error: str = ""  # why it could not be measured (it did not start, or ran out of memory)

    @property
    def ok(self) -> bool:
        return not self.error and self.prompt_tps > 0 and self.decode_tps > 0

    def seconds(self, prompt_tokens: int, decode_tokens: int) -> float:
        if not self.ok:
            return math.inf
        return prompt_tokens / self.prompt_tps + decode_tokens / self.decode_tps


Measure = Callable[[Variant, LaunchPlan], Measurement]


@dataclass(frozen=True)
class Candidate:
    variant: Variant
    plan: LaunchPlan
    predicted_s: float  # predicted seconds for the test request


@dataclass(frozen=True)
class Trial:
    candidate: Candidate
    measured: Measurement


@dataclass(frozen=True)
class TuneRequest:
    layout: ModelLayout
    hardware: HardwareProfile
    options: PlanOptions = field(default_factory=PlanOptions)
    prompt_tokens: int = PROMPT_TOKENS
    decode_tokens: int = DECODE_TOKENS
    exhaustive: bool = False  # measure every candidate (the sweep the tuner is checked by)


@dataclass(frozen=True)
class TuneResult:
    request: TuneRequest
    candidates: tuple[Candidate, ...]
    trials: tuple[Trial, ...]
    best: Trial
    plan_default: Trial
    engine_default: Trial | None
    wall_s: float

    def seconds(self, t: Trial) -> float:
        return t.measured.seconds(self.request.prompt_tokens, self.request.decode_tokens)

    def gain_over(self, t: Trial | None) -> float | None:
        """How much less time the best variant needs than ``t`` (0.12 = 12 %)."""
        if t is None or not t.measured.ok:
            return None
        return 1.0 - self.seconds(self.best) / self.seconds(t)

    def choice(self, when: float) -> TunedChoice:
        v = self.best.candidate.variant
        return TunedChoice(
            threads=v.threads,
            threads_batch=v.threads_batch,
            batch=v.batch,
            ubatch=v.ubatch,
            n_cpu_moe=v.n_cpu_moe,
            mmproj_on_cpu=v.mmproj_on_cpu,
            label="" if v == Variant() else v.label(),
            gain_over_plan=max(0.0, self.gain_over(self.plan_default) or 0.0),
            when=when,
        )

    def summary(self) -> list[str]:
        r = self.request
        b = self.best
        lines = [
            f"Measured {len(self.trials)} of {len(self.candidates)} variants in "
            f"{self.wall_s:.0f} s (test request: {r.prompt_tokens}-token prompt, "
            f"{r.decode_tokens}-token answer).",
            f"Fastest: {b.candidate.variant.label()}: prompt {fmt_tps3(b.measured.prompt_tps)} "
            f"tok/s, decode {fmt_tps3(b.measured.decode_tps)} tok/s, "
            f"{self.seconds(b):.2f} s for the test request.",
        ]
        for what, t in (("the plan's default", self.plan_default),
                        ("llama.cpp's own defaults", self.engine_default)):  # fmt: skip
            gain = self.gain_over(t)
            if t is None:
                continue
            if gain is None:
                lines.append(f"Over {what}: not measured ({t.measured.error or 'no answer'}).")
            elif t is b:
                lines.append(f"Over {what}: nothing to gain; it is the fastest.")
            else:
                verdict = (
                    f"{gain:.0%} less time."
                    if gain >= 0
                    else f"{-gain:.0%} more time ({what} measured faster this run)."
                )
                lines.append(
                    f"Over {what} ({self.seconds(t):.2f} s: prompt "
                    f"{fmt_tps3(t.measured.prompt_tps)}, decode "
                    f"{fmt_tps3(t.measured.decode_tps)} tok/s): {verdict}"
                )
        return lines


def test_seconds(plan: LaunchPlan, prompt_tokens: int, decode_tokens: int) -> float:
    """The predicted time of the test request (decode alone where prompts are not
    predicted, i.e. with a GPU in the plan)."""
    s = plan.speed
    t = decode_tokens / s.expected_tps if s.expected_tps > 0 else math.inf
    if s.prompt_tps > 0:
        t += prompt_tokens / s.prompt_tps
    return t


def thread_counts(hw: HardwareProfile) -> list[int]:
    """-t values worth measuring: every count up to 4 cores; on bigger machines a
    half, three quarters and all of the physical cores, and the hyper-threads."""
    cores = default_threads(hw)
    if cores <= 4:
        out = set(range(1, cores + 1))
    else:
        out = {max(1, cores // 2), max(1, (3 * cores) // 4), cores}
    if hw.cpu.logical_cores > cores:
        out.add(hw.cpu.logical_cores)
    return sorted(out)


def candidates(req: TuneRequest) -> list[Candidate]:
    """Every variant of the grid that fits, with its prediction (the default first)."""
    hw, layout, base = req.hardware, req.layout, req.options
    base_plan = make_plan(hw, layout, base)
    threads = thread_counts(hw)
    default_t = default_threads(hw)
    moe: list[int | None] = [None]
    proj: list[bool | None] = [None]
    if hw.gpus and base_plan.verdict in ("gpu", "hybrid"):
        n_moe = len(layout.moe_layers)
        step = max(1, n_moe // 10)
        for n in (max(0, base_plan.n_cpu_moe - step), min(n_moe, base_plan.n_cpu_moe + step)):
            if n != base_plan.n_cpu_moe and n not in moe:
                moe.append(n)
        if base.mmproj is not None:
            proj.append(base_plan.mmproj_on_gpu)  # on_gpu True -> move it to RAM, and back
    out: list[Candidate] = []
    seen: set[tuple[object, ...]] = set()

    def add(v: Variant) -> None:
        try:
            plan = make_plan(hw, layout, v.options(base))
        except PlanError:
            return
        gpus = [d for d in plan.devices if d.device != "RAM"]
        if plan.verdict == "no-fit" or any(d.headroom < 0 for d in gpus):
            return
        # A prompt of P tokens is cut into batches of min(-b, P) tokens and those into
        # micro-batches of min(-ub, -b) (llama_context::decode, src/llama-context.cpp in
        # b11434; -ub is clamped to -b): variants that cut the test prompt the same way
        # measure the same thing, so only the first of them is kept.
        eff_b = min(v.batch or LLAMA_DEFAULT_BATCH[0], req.prompt_tokens)
        eff_ub = min(v.ubatch or LLAMA_DEFAULT_BATCH[1], eff_b)
        rest = without_batch_args(plan.server_args)
        key = (eff_b, eff_ub, *rest)
        if key in seen:
            return
        seen.add(key)
        out.append(Candidate(v, plan, test_seconds(plan, req.prompt_tokens, req.decode_tokens)))

    add(Variant())
    for t in threads:
        for tb in threads:
            for b, ub in BATCH_PAIRS:
                for cpu_moe in moe:
                    for p in proj:
                        add(
                            Variant(
                                threads=None if t == default_t else t,
                                threads_batch=None if tb == t else tb,
                                batch=None if b == LLAMA_DEFAULT_BATCH[0] else b,
                                ubatch=None if ub == LLAMA_DEFAULT_BATCH[1] else ub,
                                n_cpu_moe=cpu_moe,
                                mmproj_on_cpu=p,
                            )
                        )
    return out


def without_batch_args(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` less its ``-b``/``-ub`` flags and their values."""
    return without(args, BATCH, UBATCH)


def budget(n_candidates: int) -> int:
    """Measurements the tuner may spend, llama.cpp's defaults included: a tenth of
    the grid, at least three."""
    return max(3, n_candidates // 10)


def choose(cands: Sequence[Candidate], n: int) -> list[Candidate]:
    """The plan's default, then per decoding setup the predicted best, best first,
    then the next-best predictions, up to ``n``."""
    if not cands:
        return []
    chosen = [cands[0]]
    by_group: dict[tuple[object, ...], Candidate] = {}
    order = sorted(range(len(cands)), key=lambda i: (cands[i].predicted_s, i))
    for i in order:
        by_group.setdefault(cands[i].variant.decode_group(), cands[i])
    for c in sorted(by_group.values(), key=lambda c: c.predicted_s):
        if len(chosen) >= n:
            break
        if c not in chosen:
            chosen.append(c)
    for i in order:
        if len(chosen) >= n:
            break
        if cands[i] not in chosen:
            chosen.append(cands[i])
    return chosen


def engine_default_candidate(req: TuneRequest, base: Candidate) -> Candidate:
    """llama.cpp's own defaults for the same model: -m, the same context, nothing else."""
    args = engine_defaults_args(str(req.layout.first_part), base.plan.ctx, req.options.mmproj)
    plan = replace(base.plan, server_args=args)
    return Candidate(Variant(engine_defaults=True), plan, math.inf)


def tune(
    req: TuneRequest,
    measure: Measure,
    *,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TuneResult:
    """Measure the chosen variants (all of them with ``req.exhaustive``); the fastest wins."""
    t0 = clock()
    cands = candidates(req)
    if not cands:
        raise PlanError(
            f"No launch variant of {req.layout.first_part.name} fits this machine.",
            f"See `k3desk plan {req.layout.first_part}`.",
        )
    picked = list(cands) if req.exhaustive else choose(cands, budget(len(cands)) - 1)
    picked.append(engine_default_candidate(req, cands[0]))
    trials: list[Trial] = []
    for i, c in enumerate(picked):
        if cancel is not None:
            cancel.raise_if_cancelled()
        progress(Progress("measure", i, len(picked), c.variant.label()))
        trials.append(Trial(c, measure(c.variant, c.plan)))
    progress(Progress("measure", len(picked), len(picked), "done"))
    ok = [t for t in trials if t.measured.ok and not t.candidate.variant.engine_defaults]
    if not ok:
        why = "; ".join(f"{t.candidate.variant.label()}: {t.measured.error}" for t in trials)
        raise EngineError(f"No launch variant could be measured: {why}", "See the engine's log.")
    best = min(ok, key=lambda t: t.measured.seconds(req.prompt_tokens, req.decode_tokens))
    default = next(t for t in trials if t.candidate is cands[0])
    engine_default = trials[-1]
    return TuneResult(req, tuple(cands), tuple(trials), best, default, engine_default, clock() - t0)


def save(result: TuneResult, store: TunedStore, when: float | None = None) -> TunedChoice:
    """Keep the fastest variant for the next launch of this model on this machine."""
    choice = result.choice(time.time() if when is None else when)
    store.put(result.request.hardware, result.request.layout, choice)
    return choice


# ------------------------------------------------------------------ measuring


def test_prompt(n_tokens: int, n_vocab: int) -> list[int]:
    """A fixed prompt of ``n_tokens`` ordinary token ids (no control tokens: those sit
    at the top of the Kimi vocabularies)."""
    span = max(2, min(n_vocab, 100_000) - 64)
    return [1 + (i * 7919) % span for i in range(n_tokens)]


class ServerMeasure:
    """Measures a variant with the real llama-server (see the module docstring)."""

    def __init__(
        self,
        engine: Path,
        paths: AppPaths,
        layout: ModelLayout,
        *,
        prompt_tokens: int = PROMPT_TOKENS,
        decode_tokens: int = DECODE_TOKENS,
        repeats: int = 2,
        api_key_file: bool = False,
        cancel: CancelToken | None = None,
        request_timeout: float = 600.0,
    ) -> None:
        self.engine = engine
        self.paths = paths
        self.layout = layout
        self.prompt = test_prompt(prompt_tokens, layout.hparams.vocab_size)
        self.decode_tokens = decode_tokens
        self.repeats = max(1, repeats)
        self.api_key_file = api_key_file
        self.cancel = cancel
        self.request_timeout = request_timeout

    def __call__(self, variant: Variant, plan: LaunchPlan) -> Measurement:
        t0 = time.monotonic()
        spec = LaunchSpec(
            self.engine,
            tuple(plan.server_args),
            model_bytes=self.layout.total_file_bytes,
            n_layers=len(self.layout.layers),
            api_key_file=self.api_key_file,
        )
        sup = Supervisor(spec, self.paths, policy=RestartPolicy(max_failures=1, max_replans=0))
        try:
            sup.start()
            ep = sup.wait_ready(cancel=self.cancel)
            client = httpx.Client(base_url=ep.url, headers=ep.headers, timeout=self.request_timeout)
            with client as c:
                self._complete(c, self.prompt[:8], 2)  # warm-up: page in, first graph
                best_p = best_d = 0.0
                for _ in range(self.repeats):
                    if self.cancel is not None:
                        self.cancel.raise_if_cancelled()
                    p, d = self._complete(c, self.prompt, self.decode_tokens)
                    best_p, best_d = max(best_p, p), max(best_d, d)
            return Measurement(best_p, best_d, time.monotonic() - t0)
        except Cancelled:
            raise
        except (K3Error, httpx.HTTPError, ValueError, KeyError) as exc:
            return Measurement(wall_s=time.monotonic() - t0, error=str(exc)[:300])
        finally:
            sup.stop()

    @staticmethod
    def _complete(c: httpx.Client, prompt: list[int], n: int) -> tuple[float, float]:
        r = c.post(
            "/completion",
            json={
                "prompt": prompt,
                "n_predict": n,
                "cache_prompt": False,
                "ignore_eos": True,
                "temperature": 0.0,
                "top_k": 1,
                "seed": 1,
            },
        )
        r.raise_for_status()
        t = r.json()["timings"]
        return float(t["prompt_per_second"]), float(t["predicted_per_second"])


# ------------------------------------------------------------------ the use-case


@dataclass(frozen=True)
class TuneModelRequest:
    """``k3desk tune SHARD`` (and the Engine page's button): what to tune, where."""

    shard: Path
    paths: AppPaths
    hardware: HardwareSource
    options: PlanOptions = field(default_factory=PlanOptions)
    mmproj: Path | None = None
    engine: Path | None = None
    configured: str | Path | None = None
    catalog: tuple[Tier, ...] = ()
    prompt_tokens: int = PROMPT_TOKENS
    decode_tokens: int = DECODE_TOKENS
    repeats: int = 2
    exhaustive: bool = False
    save: bool = True


@dataclass(frozen=True)
class TuneModelResult:
    result: TuneResult
    engine: Path
    saved: TunedChoice | None
    notes: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        out = self.result.summary()
        if self.saved is not None:
            out.append(
                "Saved: the next launch of this model on this machine uses "
                f"{self.saved.label or 'the plan as it is'} (`k3desk tune --forget` undoes it)."
            )
        return [*self.notes, *out]

    def to_dict(self) -> dict[str, object]:
        """The trials as ``k3desk tune --json`` prints them (an unmeasured time: None)."""
        r = self.result

        def finite(x: float | None) -> float | None:
            return x if x is not None and math.isfinite(x) else None

        return {
            "engine": str(self.engine),
            "candidates": len(r.candidates),
            "seconds": r.wall_s,
            "best": r.best.candidate.variant.label(),
            "gain_over_plan": r.gain_over(r.plan_default),
            "gain_over_llama_defaults": r.gain_over(r.engine_default),
            "saved": self.saved is not None,
            "notes": list(self.notes),
            "trials": [
                {
                    "variant": t.candidate.variant.label(),
                    "args": list(t.candidate.plan.server_args),
                    "predicted_s": finite(t.candidate.predicted_s),
                    "prompt_tps": t.measured.prompt_tps,
                    "decode_tps": t.measured.decode_tps,
                    "seconds": finite(r.seconds(t)),
                    "error": t.measured.error,
                }
                for t in r.trials
            ],
        }


MeasureFactory = Callable[[PreparedLaunch, TuneModelRequest, CancelToken | None], Measure]


def _server_measure(
    prepared: PreparedLaunch, req: TuneModelRequest, cancel: CancelToken | None
) -> Measure:
    return ServerMeasure(
        prepared.engine,
        req.paths,
        prepared.layout,
        prompt_tokens=req.prompt_tokens,
        decode_tokens=req.decode_tokens,
        repeats=req.repeats,
        api_key_file=prepared.api_key_file,
        cancel=cancel,
    )


def tune_model(
    req: TuneModelRequest,
    *,
    progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    measure_factory: MeasureFactory = _server_measure,
) -> TuneModelResult:
    """Validate, choose the engine and plan as a launch does (without earlier tuned
    settings), tune, and keep the fastest for the next launch (``req.save``)."""
    if req.prompt_tokens < 1 or req.decode_tokens < 1:
        raise PlanError(
            "The test request needs at least one prompt token and one answer token "
            f"(got {req.prompt_tokens} and {req.decode_tokens})."
        )
    prepared = prepare_launch(
        req.shard,
        mmproj=req.mmproj,
        hardware=req.hardware,
        options=req.options,
        paths=req.paths,
        engine=req.engine,
        configured=req.configured,
        catalog=req.catalog,
        cancel=cancel,
        on_progress=progress,
        tuned=None,  # measured from the plan itself, not from an earlier tuning
    )
    ctx = prepared.plan.ctx
    if req.prompt_tokens + req.decode_tokens > ctx:
        raise PlanError(
            f"The test request ({req.prompt_tokens} prompt + {req.decode_tokens} answer "
            f"tokens) does not fit the {ctx}-token context: use a smaller --prompt-tokens "
            "or a larger --ctx."
        )
    treq = TuneRequest(
        prepared.layout,
        prepared.hardware,
        prepared.options,
        prompt_tokens=req.prompt_tokens,
        decode_tokens=req.decode_tokens,
        exhaustive=req.exhaustive,
    )
    measure = measure_factory(prepared, req, cancel)
    result = tune(treq, measure, progress=progress, cancel=cancel)
    notes = list(prepared.notes)
    saved = None
    if req.save and is_this_machine(prepared.hardware):
        saved = save(result, TunedStore(req.paths.state))
    elif req.save:
        notes.append("Not saved: the hardware came from a file, not from this machine.")
    return TuneModelResult(result, prepared.engine, saved, tuple(notes))


def forget_tuned(
    shard: Path, paths: AppPaths, hardware: HardwareProfile, catalog: Sequence[Tier] = ()
) -> bool:
    """Drop the tuned settings of ``shard``'s model on this machine; True if there were."""
    layout = inspect_shard_set(shard, tiers=catalog).layout
    return TunedStore(paths.state).forget(hardware, layout)
