"""Predicted decode speed against the six llama.cpp speeds the seed model cards publish.

    python bench/predict_speed.py          # the table

Each case plans the card's tier on the card's machine (``resources/hardware``)
with the card's settings, then compares k3desk's expected tok/s with the card's.
Nothing in ``k3desk/core/planning/speed.py`` is fitted to these figures: the CPU
costs are measured (``bench/kernel_costs.py``), the GPU constants are stated in
the module.  This is the model's second check, on machines this project does
not have; the first is ``bench/speed_vs_measured.py``, against real runs.  The
cards' machines, settings and tensor types are partly assumed (see each tier's
``tensor_types_note``), so a miss here may be the card's setup as much as the model.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from k3desk.core.catalog.loader import Catalog, load_catalog  # noqa: E402
from k3desk.core.catalog.model import Tier  # noqa: E402
from k3desk.core.gguf.model import ModelLayout  # noqa: E402
from k3desk.core.hardware.profile import HardwareProfile  # noqa: E402
from k3desk.core.planning import speed  # noqa: E402
from k3desk.core.planning.estimate import estimate_layout  # noqa: E402
from k3desk.core.planning.model import LaunchPlan, PlanOptions  # noqa: E402
from k3desk.core.planning.plan import make_plan  # noqa: E402
from k3desk.core.planning.speed import explain  # noqa: E402
from k3desk.core.units import GB  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    hardware: str  # resources/hardware/<name>.json
    tier: str
    card_tps: float
    opts: PlanOptions
    source: str


def unsloth_ud_iq1s(catalog: Catalog) -> Tier:
    """Unsloth's UD-IQ1_S, 6block's comparison point: not a catalog tier of its own.

    About 594 GB (6block: IQ1_S-XS is 2.4 % smaller, 539.7 GiB / 0.976), all
    896 full-width experts, non-experts near Q8_0.
    """
    base = catalog.get("vcruz305-ud-iq1s")
    return replace(
        base,
        id="unsloth-ud-iq1s",
        name="UD-IQ1_S (unsloth)",
        size_bytes=round(539.7 * 1024**3 / 0.976),
        expert_feed_forward_length=3072,
    )


CASES = (
    Case(
        "6block UD-IQ1_S",
        "8xH100-2TB",
        "unsloth-ud-iq1s",
        11.5,
        PlanOptions(ctx=8192, n_cpu_moe=93),
        "6block card: same machine as its IQ1_S-XS, -ngl 99 --n-cpu-moe 93",
    ),
    Case(
        "6block IQ1_S-XS",
        "8xH100-2TB",
        "6block-iq1s-xs",
        6.8,
        PlanOptions(ctx=8192, n_cpu_moe=93),
        "6block card: -ngl 99 --n-cpu-moe 93 -c 8192",
    ),
    Case(
        "AtomicChat IQ1_S",
        "epyc9554p-1.5TB-cpu",
        "atomicchat-iq1s",
        1.82,
        PlanOptions(ctx=4096, threads=110),
        "AtomicChat card: llama-bench tg128, 110 threads, no GPU",
    ),
    Case(
        "vcruz305 UD-IQ1_S",
        "8xA100-80GB",
        "vcruz305-ud-iq1s",
        10.8,
        PlanOptions(ctx=8192),
        "vcruz305 card: llama.cpp, 8x A100-80GB, -ngl 99 (316,036 MiB resident)",
    ),
    Case(
        "GrEarl IQ1_S",
        "512GB-ddr5-96GB-vram",
        "grearl-iq1s",
        5.0,
        PlanOptions(ctx=32768),
        "GrEarl card: user report, 32K context, split not stated (k3desk plans it)",
    ),
    Case(
        "AtomicChat Q3_K_S",
        "epyc9554p-1.5TB-cpu",
        "atomicchat-q3ks",
        1.70,
        PlanOptions(ctx=4096, threads=110),
        "AtomicChat card, same box, 110 threads",
    ),
)


@dataclass(frozen=True)
class Row:
    case: Case
    hw: HardwareProfile
    layout: ModelLayout
    plan: LaunchPlan


def build_rows() -> list[Row]:
    catalog = load_catalog(REPO / "resources" / "catalog.json")
    extra = {"unsloth-ud-iq1s": unsloth_ud_iq1s(catalog)}
    rows = []
    for case in CASES:
        hw = HardwareProfile.from_json_file(
            REPO / "resources" / "hardware" / f"{case.hardware}.json"
        )
        tier = extra.get(case.tier) or catalog.get(case.tier)
        layout = estimate_layout(tier)
        rows.append(Row(case, hw, layout, make_plan(hw, layout, case.opts)))
    return rows


def predict(row: Row) -> tuple[float, float, float, float]:
    p = speed.predict_speed(
        row.hw,
        row.layout,
        row.plan.layers,
        row.plan.output_device,
        ctx=row.case.opts.ctx,
        kv_type=row.case.opts.kv_type,
        stream_miss=0.0,
        threads=row.case.opts.threads,
    )
    return p.expected_tps, p.low_tps, p.high_tps, p.upper_bound_tps


def table(rows: list[Row]) -> float:
    head = (
        f"{'case':<20} {'hardware':<22} {'tier':<22} {'verdict':<7} {'N':>3} "
        f"{'card':>6} {'expected (low-high)':>21} {'bound':>6} {'error':>7}"
    )
    print(head)
    print("-" * len(head))
    worst = 0.0
    for row in rows:
        exp, low, high, bound = predict(row)
        err = (exp - row.case.card_tps) / row.case.card_tps
        worst = max(worst, abs(err))
        print(
            f"{row.case.name:<20} {row.case.hardware:<22} {row.case.tier:<22} "
            f"{row.plan.verdict:<7} {row.plan.n_cpu_moe:>3} {row.case.card_tps:>6.2f} "
            f"{exp:>7.2f} ({low:5.2f}-{high:5.2f}) {bound:>6.1f} {err:>+7.1%}"
        )
    print(f"\nworst error over the {len(rows)} cards: {worst:.1%} (no factor fitted to them)")
    for row in rows:
        tokens = ", ".join(
            f"{k} {v / GB:.1f} GB"
            for k, v in sorted(row.plan.speed.bytes_per_token.items())
            if v > 0.05 * GB
        )
        print(f"  {row.case.name}: {row.case.source}; per token: {tokens}")
        for line in explain(row.plan.speed):
            print(f"      {line}")
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    table(build_rows())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
