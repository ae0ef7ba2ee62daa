"""The tuner against an exhaustive sweep of the same variants, with the real llama-server.

    python bench/tune_vs_sweep.py [--model M-ud] [--max-load 1.0] [--repeats 2]

On this machine's mid-size bench model (``k3desk/devtools/benchk3.py``, built once
and cached), the tuner (``k3desk.core.tuning.tune``) measures the few variants it
chooses with the speed model, then the sweep measures every variant of the same
grid, each with the same fixed test request (512-token prompt, 32-token answer)
on a freshly started llama-server.  Printed: every variant's measured time in
the sweep, where the tuner's pick ranks in it, and the two goals:

* the tuner's pick, as the sweep measured it, within 5 % of the sweep's best;
* the tuner's wall time at most a tenth of the sweep's.

and what the pick gains over the plan's default and over llama.cpp's own
defaults (``-m`` and ``-c`` only).  Both runs are measured in the same session,
so they share the machine's load; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from k3desk.core.catalog.loader import load_catalog  # noqa: E402
from k3desk.core.gguf.validate import validate_shard_set  # noqa: E402
from k3desk.core.hardware.detect import detect_hardware  # noqa: E402
from k3desk.core.paths import default_paths  # noqa: E402
from k3desk.core.planning.model import PlanOptions  # noqa: E402
from k3desk.core.progress import Progress  # noqa: E402
from k3desk.core.tuning.tune import ServerMeasure, TuneRequest, TuneResult, tune  # noqa: E402
from k3desk.devtools.benchk3 import BENCH_MODELS, DEFAULT_CACHE, build_model  # noqa: E402
from k3desk.devtools.measure import default_bin, load_average, wait_quiet  # noqa: E402

GOAL_GAP = 0.05
GOAL_TIME = 0.10


def _progress(p: Progress) -> None:
    if p.stage == "measure" and p.detail != "done":
        print(f"  [{p.done + 1}/{p.total}] {p.detail} (load {load_average():.2f})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="M-ud", help="a bench model (default M-ud, 2.1 GB)")
    parser.add_argument("--repeats", type=int, default=2, help="test requests per variant")
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--max-wait", type=float, default=600.0)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    bin_dir = default_bin()
    catalog = load_catalog(REPO / "resources" / "catalog.json")
    model = next(m for m in BENCH_MODELS if m.name == args.model)
    path = build_model(model, catalog.get(model.tier), bin_dir, args.cache, progress=print)
    layout = validate_shard_set(path)
    hw = detect_hardware(measure_bandwidth=False)
    req = TuneRequest(layout, hw, PlanOptions(ctx=4096))
    with tempfile.TemporaryDirectory(prefix="k3desk-tune-bench-") as home:
        paths = default_paths({"K3DESK_HOME": home}).ensure()
        measure = ServerMeasure(bin_dir / "llama-server", paths, layout, repeats=args.repeats)
        load0 = wait_quiet(args.max_load, args.max_wait)
        print(f"Tuner on {path.name} (load average {load0:.2f}):")
        quick = tune(req, measure, progress=_progress)
        load1 = wait_quiet(args.max_load, args.max_wait)
        print(f"Exhaustive sweep (load average {load1:.2f}):")
        sweep = tune(TuneRequest(layout, hw, req.options, exhaustive=True), measure,
                     progress=_progress)  # fmt: skip
    return report(quick, sweep, (load0, load1))


def report(quick: TuneResult, sweep: TuneResult, loads: tuple[float, float]) -> int:
    by_args = {t.candidate.plan.server_args: t for t in sweep.trials}
    ranked = sorted(
        (t for t in sweep.trials if t.measured.ok and not t.candidate.variant.engine_defaults),
        key=sweep.seconds,
    )
    pick = quick.best.candidate
    in_sweep = by_args.get(pick.plan.server_args)
    print()
    print(f"{'rank':>4} {'variant':<34} {'predicted s':>11} {'prompt':>7} {'decode':>7} "
          f"{'seconds':>8}")  # fmt: skip
    for i, t in enumerate(ranked, start=1):
        mark = " <- tuner's pick" if t is in_sweep else ""
        print(
            f"{i:>4} {t.candidate.variant.label():<34} {t.candidate.predicted_s:>11.2f} "
            f"{t.measured.prompt_tps:>7.2f} {t.measured.decode_tps:>7.2f} "
            f"{sweep.seconds(t):>8.2f}{mark}"
        )
    eng = sweep.engine_default
    if eng is not None and eng.measured.ok:
        print(f"   - llama.cpp's defaults{'':<12} {'':>11} {eng.measured.prompt_tps:>7.2f} "
              f"{eng.measured.decode_tps:>7.2f} {sweep.seconds(eng):>8.2f}")  # fmt: skip
    print("\n(prompt/decode: tok/s, best of the repeats; seconds: the test request's time)")
    print("\nThe tuner's own run:")
    for line in quick.summary():
        print(f"  {line}")
    best = ranked[0]
    pick_s = sweep.seconds(in_sweep) if in_sweep is not None else float("inf")
    gap = pick_s / sweep.seconds(best) - 1.0
    time_ratio = quick.wall_s / sweep.wall_s
    rank = ranked.index(in_sweep) + 1 if in_sweep in ranked else 0
    print(
        f"\nsweep: {len(sweep.trials)} runs in {sweep.wall_s:.0f} s; tuner: "
        f"{len(quick.trials)} runs in {quick.wall_s:.0f} s ({time_ratio:.1%} of the sweep's "
        f"time; goal <= {GOAL_TIME:.0%})"
    )
    print(
        f"load average: {loads[0]:.2f} before the tuner, {loads[1]:.2f} before the sweep, "
        f"{load_average():.2f} now"
    )
    ok = gap <= GOAL_GAP and time_ratio <= GOAL_TIME
    print(
        f"tuner's pick ({pick.variant.label()}) ranks {rank} of {len(ranked)} in the sweep, "
        f"{gap:+.1%} slower than its best ({best.candidate.variant.label()}); goal within "
        f"{GOAL_GAP:.0%} in <= {GOAL_TIME:.0%} of the time: {'met' if ok else 'NOT met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
