"""Predicted against measured: k3desk's speed model on real Kimi-K3 runs of this machine.

    python bench/speed_vs_measured.py [--threads 1,2] [--max-load 0.5] [--models S-grearl]
    python bench/speed_vs_measured.py --reuse   # predict again against the recorded runs
    python bench/speed_vs_measured.py --reuse --kernels FILE   # ... with other costs

Builds (once, cached under ~/.cache/k3desk-bench) kimi-k3 GGUFs of three sizes
(0.5, 1.5-2.3 and 6.6 GB) with the type mixes of four published tiers, quantized
by the engine's own llama-quantize (IQ1_S experts with an imatrix from
llama-imatrix; see ``k3desk/devtools/benchk3.py``).  Then, on a quiet machine
(it waits for the load average to drop), measures each with ``llama-bench``:
prompt (pp128) and decode (tg32) tok/s at every thread count asked for, in
``--rounds`` rounds (every model and thread count once per round, three
repetitions each; the median of the rounds: a 2-core cloud machine's decode
speed moves by a quarter within minutes with its neighbours' memory traffic,
see ``k3desk/devtools/measure.py``); and prints k3desk's prediction for each
from this machine's doctor profile (``detect_hardware``), with the error and
how far the rounds were apart.  The RAM bandwidth is the doctor's copy benchmark
read before every round, the median (six readings within two minutes ranged from
23 to 64 GB/s on that machine), and is recorded with the runs, so that
``--reuse`` predicts with the bandwidth of the runs' own time.

Nothing in the prediction is fitted to these runs: the CPU costs come from
``bench/kernel_costs.py`` (single-type dense models, tiny overhead models), the
bandwidth from the doctor's copy benchmark.  The card speeds
(``bench/predict_speed.py``) follow as a second check.  Goal: every error
within +/-25 %; the last line prints the worst one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from k3desk.core.catalog.loader import load_catalog  # noqa: E402
from k3desk.core.gguf.validate import validate_shard_set  # noqa: E402
from k3desk.core.hardware.bandwidth import (  # noqa: E402
    benchmark_threads,
    fmt_bandwidth,
    measure_ram_bandwidth,
)
from k3desk.core.hardware.detect import detect_hardware  # noqa: E402
from k3desk.core.hardware.profile import Bandwidth, HardwareProfile  # noqa: E402
from k3desk.core.planning import kernels  # noqa: E402
from k3desk.core.tuning.cpuprobe import CpuProbeStore, predicted  # noqa: E402
from k3desk.core.units import fmt_bytes  # noqa: E402
from k3desk.devtools.benchk3 import BENCH_MODELS, DEFAULT_CACHE, BenchModel, build_model  # noqa: E402
from k3desk.devtools.measure import (  # noqa: E402
    BenchResult,
    default_bin,
    in_rounds,
    llama_bench,
    load_average,
    repetitions_per_round,
    wait_quiet,
)

GOAL = 0.25
PP, TG = 128, 32


@dataclass(frozen=True)
class Row:
    model: BenchModel
    path: Path
    threads: int
    test: str  # "prompt" / "decode"
    predicted: float
    measured: float
    spread: float
    load: float
    ram_bps: float = 0.0  # the bandwidth the prediction used (the rounds' median)

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured if self.measured > 0 else 0.0


def predict(
    hw: HardwareProfile, path: Path, threads: int, costs: kernels.Kernels | None = None
) -> tuple[float, float]:
    """Prompt and decode tok/s as k3desk plans them (``costs``: another cost file)."""
    layout = validate_shard_set(path)
    return predicted(hw, layout, threads, costs, prompt_tokens=PP, gen_tokens=TG)


def _recorded(record: Path) -> dict[tuple[str, int, str], dict[str, float]]:
    """The runs measured before (the newest of each file, thread count and test)."""
    try:
        runs = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {(r["file"], int(r["threads"]), r["test"]): r for r in runs}


def _record(record: Path, rows: list[Row]) -> None:
    """Keep what was measured (never the prediction), so --reuse can predict again."""
    try:
        runs = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        runs = []
    for r in rows:
        runs.append(
            {
                "file": r.path.name,
                "threads": r.threads,
                "test": r.test,
                "tps": r.measured,
                "spread": r.spread,
                "load": r.load,
                "ram_bps": r.ram_bps,
                "date": dt.date.today().isoformat(),
            }
        )
    record.write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")


def _measure(
    args: argparse.Namespace,
    bin_dir: Path,
    hw: HardwareProfile,
    paths: dict[str, Path],
    keys: list[tuple[BenchModel, int]],
    costs: kernels.Kernels | None,
) -> list[Row]:
    """Every model at every thread count once per round, ``args.rounds`` rounds."""
    reps = repetitions_per_round(args.repetitions, args.rounds)
    loads: dict[tuple[str, int], float] = {}

    def job(m: BenchModel, t: int) -> Callable[[], list[BenchResult]]:
        def run() -> list[BenchResult]:
            loads.setdefault((m.name, t), wait_quiet(args.max_load, args.max_wait))
            return llama_bench(
                bin_dir, paths[m.name], threads=t, n_prompt=PP, n_gen=TG, repetitions=reps
            )

        return run

    readings: list[float] = []

    def reading(i: int) -> None:
        bw = measure_ram_bandwidth(threads=benchmark_threads(hw.cpu.usable_cores))
        readings.append(bw.bytes_per_s)
        print(
            f"round {i + 1} of {args.rounds} (load average {load_average():.2f}; "
            f"RAM {bw.bytes_per_s / 1e9:.1f} GB/s)",
            flush=True,
        )

    results = in_rounds({(m.name, t): job(m, t) for m, t in keys}, args.rounds, reading)
    hw = with_ram(hw, statistics.median(readings), f"median of {len(readings)} rounds")
    print(f"RAM bandwidth for the predictions: {fmt_bandwidth(hw.memory.bandwidth)}")
    rows: list[Row] = []
    for m, t in keys:
        by = {r.test: r for r in results[(m.name, t)]}
        pp, tg = by[f"pp{PP}"], by[f"tg{TG}"]
        p_pp, p_tg = predict(hw, paths[m.name], t, costs)
        load = loads[(m.name, t)]
        bps = hw.memory.bandwidth.bytes_per_s
        rows.append(Row(m, paths[m.name], t, "prompt", p_pp, pp.median_tps, pp.spread, load, bps))
        rows.append(Row(m, paths[m.name], t, "decode", p_tg, tg.median_tps, tg.spread, load, bps))
    return rows


def with_ram(hw: HardwareProfile, bps: float, how: str) -> HardwareProfile:
    """``hw`` with the RAM bandwidth the copy benchmark read (``how``: over what)."""
    note = f"{how}: {bps / 1e9:.1f} GB/s"
    return replace(hw, memory=replace(hw.memory, bandwidth=Bandwidth(bps, "measured", note)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="", help="comma-separated (default: 1 and all cores)")
    parser.add_argument("--max-load", type=float, default=0.5)
    parser.add_argument("--max-wait", type=float, default=1800.0, help="seconds (default 1800)")
    parser.add_argument(
        "--repetitions", type=int, default=5, help="in all, over the rounds (default 5)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="measure every model once per round, this many rounds; keep the median "
        "(default 3; 1: one run of --repetitions each)",
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--engine-bin", type=Path)
    parser.add_argument("--models", default="", help="comma-separated names (default: all)")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="predict again against the runs recorded in the cache (measured.json), "
        "measuring nothing",
    )
    parser.add_argument(
        "--kernels",
        type=Path,
        help="predict with this cost file (bench/kernel_costs.py --out) instead of "
        "resources/kernels.json: costs measured on this machine",
    )
    parser.add_argument(
        "--cpu-check",
        type=Path,
        metavar="STATE_DIR",
        help="predict with the shipped (or --kernels) costs scaled by the CPU check kept "
        "in this state folder (`k3desk doctor --check-cpu`, core/tuning/cpuprobe.py): "
        "costs measured on another machine, corrected by a minute's run here",
    )
    args = parser.parse_args()
    costs = kernels.load(args.kernels.resolve()) if args.kernels else None
    if args.cpu_check:
        hw_here = detect_hardware(measure_bandwidth=False)
        probe = CpuProbeStore(args.cpu_check).get(hw_here, costs)
        if probe is None:
            print(f"No CPU check of this machine and engine in {args.cpu_check}.")
            return 2
        costs = (costs or kernels.load()).scaled(probe.scale())
        print(f"Costs: {costs.source}")
    bin_dir = args.engine_bin or default_bin()
    catalog = load_catalog(REPO / "resources" / "catalog.json")
    chosen = [m for m in BENCH_MODELS if not args.models or m.name in args.models.split(",")]
    paths = {}
    for m in chosen:
        tier = None if m.pure else catalog.get(m.tier)
        paths[m.name] = build_model(m, tier, bin_dir, args.cache, progress=print)

    load = wait_quiet(args.max_load, args.max_wait)
    hw = detect_hardware(measure_bandwidth=True)
    cores = hw.cpu.physical_cores
    threads = (
        [int(x) for x in args.threads.split(",")] if args.threads else sorted({1, cores})
    )
    print(
        f"Machine: {hw.cpu.model}, {cores} cores, RAM {fmt_bandwidth(hw.memory.bandwidth)} "
        f"(doctor profile; load average {load:.2f} when measured)"
    )
    rows: list[Row] = []
    record = args.cache / "measured.json"
    recorded = _recorded(record)
    keys = [(m, t) for m in chosen for t in threads]
    if args.reuse:
        for m, t in keys:
            path = paths[m.name]
            runs = [recorded.get((path.name, t, test)) for test in ("prompt", "decode")]
            if None in runs:
                print(f"  {m.name} t={t}: no recorded run in {record}")
                continue
            # the bandwidth read while these runs were made, where it was recorded
            bps = float(runs[0].get("ram_bps", 0.0)) if runs[0] else 0.0
            at = with_ram(hw, bps, "recorded with the runs") if bps > 0 else hw
            predicted = predict(at, path, t, costs)
            for test, pred, run in zip(("prompt", "decode"), predicted, runs, strict=True):
                assert run is not None
                rows.append(
                    Row(m, path, t, test, pred, run["tps"], run["spread"], run["load"], bps)
                )
    else:
        rows = _measure(args, bin_dir, hw, paths, keys, costs)
        _record(record, rows)
    for r in rows:
        print(
            f"  {r.model.name} t={r.threads} {r.test}: predicted {r.predicted:.2f}, "
            f"measured {r.measured:.2f} ({r.error:+.1%}), load {r.load:.2f}",
            flush=True,
        )
    load = load_average()

    print()
    head = (
        f"{'model':<10} {'size':>9} {'types':<42} {'t':>2} {'test':<7} "
        f"{'predicted':>9} {'measured':>9} {'spread':>6} {'error':>7} {'load':>5}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        size = fmt_bytes(r.path.stat().st_size)
        test = f"pp{PP}" if r.test == "prompt" else f"tg{TG}"
        print(
            f"{r.model.name:<10} {size:>9} {r.model.about:<42} {r.threads:>2} {test:<7} "
            f"{r.predicted:>9.2f} {r.measured:>9.2f} {r.spread:>6.0%} {r.error:>+7.1%} "
            f"{r.load:>5.2f}"
        )
    print(
        "\n(tok/s; measured: the median of the rounds' medians of llama-bench's repetitions; "
        "spread: (max - min) / median of the rounds (of the repetitions with --rounds 1); "
        "load: 1-minute load average before the first round)"
    )

    print("\nSecond check, the model cards' published speeds (bench/predict_speed.py):\n")
    import predict_speed as cards

    cards.table(cards.build_rows())

    worst = max(rows, key=lambda r: abs(r.error))
    ok = abs(worst.error) <= GOAL
    print(
        f"\nworst error over {len(rows)} measured runs: {worst.error:+.1%} "
        f"({worst.model.name}, {worst.test}, {worst.threads} thread(s); goal +/-{GOAL:.0%}: "
        f"{'met' if ok else 'NOT met'}; load average now {load_average():.2f})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
