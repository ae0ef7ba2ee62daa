"""``k3desk tiers``: every published Kimi-K3 tier and whether it fits this machine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3desk.cli.plan import machine
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.recommend import Recommendation, TierVerdict, recommend
from k3desk.core.units import fmt_bytes

if TYPE_CHECKING:
    from k3desk.app import Services
    from k3desk.core.catalog.model import Tier


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tiers",
        help="list the Kimi-K3 quantization tiers and which fit this machine",
        description="List every published Kimi-K3 GGUF tier with its size, experts, vision "
        "support, engines and quality figures, and say for this machine (or --hardware FILE) "
        "whether it fits, by how much it misses, and which tier to download. Works before "
        "anything is downloaded: layouts are estimated from the catalog.",
    )
    p.add_argument(
        "--hardware",
        type=Path,
        metavar="FILE",
        help="judge the tiers for the machine in FILE (`k3desk doctor --json` output)",
    )
    p.add_argument("--ctx", type=int, default=8192, metavar="N", help="context size (default 8192)")
    p.add_argument("--json", action="store_true", help="print tiers and verdicts as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, services: Services) -> int:
    catalog = services.catalog
    hw = machine(args, services, services.paths.models_dir)
    rec = recommend(hw, catalog.tiers, PlanOptions(ctx=args.ctx))
    if args.json:
        print(json.dumps(to_json(rec, hw.label or hw.hostname or hw.source), indent=2))
        return 0
    print(render(rec, hw.label or hw.hostname or "this machine"))
    return 0


def _exact(t: Tier) -> bool:
    return t.known and t.size_exact


def _quality(tv: TierVerdict) -> str:
    if not tv.tier.quality:
        return "-"
    q = tv.tier.quality[0]
    return f"{q.metric} {q.value}"


def _fit_text(tv: TierVerdict) -> str:
    plan = tv.plan
    if tv.verdict == "n/a" or plan is None:
        return f"n/a: {tv.reason}"
    s = plan.speed
    if tv.fits:
        extra = (
            f", --n-cpu-moe {plan.n_cpu_moe}" if tv.verdict == "hybrid" and plan.n_cpu_moe else ""
        )
        return f"{tv.verdict}{extra}, ~{s.expected_tps:.2g} tok/s"
    if tv.verdict == "stream":
        tps = f"~{s.expected_tps:.2g} tok/s from disk"
        return f"stream: misses RAM by {fmt_bytes(tv.shortfall)}, {tps}"
    return f"no-fit: misses by {fmt_bytes(tv.shortfall)}"


def _imatrix(t: Tier) -> str:
    return {True: "yes", False: "no", None: "?"}[t.imatrix]


def render(rec: Recommendation, machine_name: str) -> str:
    head = ("#", "tier", "publisher", "files", "size", "experts", "imatrix", "vision", "engines",
            "fit on this machine")  # fmt: skip
    rows: list[tuple[str, ...]] = [head]
    for tv in rec.verdicts:
        t = tv.tier
        experts = f"{t.experts_kept}x{t.expert_quant}"
        if t.expert_feed_forward_length != 3072:
            experts += f" (w{t.expert_feed_forward_length})"
        name = t.name + (" (ref)" if t.reference else "")
        rows.append(
            (
                str(tv.rank),
                name,
                t.publisher,
                "card" if t.known else "GUESSED",
                fmt_bytes(t.size_bytes) + ("" if _exact(t) else "?"),
                experts,
                _imatrix(t),
                t.vision,
                ",".join(t.engines),
                _fit_text(tv),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = [f"Kimi-K3 tiers for {machine_name}", ""]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)]
        lines.append("  ".join(cells) + "  " + r[-1])
    lines.insert(3, "  ".join("-" * w for w in widths) + "  " + "-" * 20)
    lines += ["", "Quality figures (as each card publishes them; not comparable across cards):"]
    for tv in rec.verdicts:
        lines.append(f"  {tv.tier.name:<16} {_quality(tv)}")
    lines += ["", "What each rank rests on:"]
    for tv in rec.verdicts:
        if tv.basis is not None:
            lines.append(f"  #{tv.rank:<3} {tv.tier.name:<16} {tv.basis.text()}")
    lines += ["", rec.summary]
    lines += [f"  Note: {n}" for n in rec.notes]
    chosen = rec.best or rec.closest
    for tv in rec.verdicts:
        if chosen is not None and tv.rank < chosen.rank and tv.why_not and not tv.tier.reference:
            lines.append(f"  - {tv.why_not}")
    if rec.best is not None and rec.best.plan is not None:
        lines.append(f"  Plan: {rec.best.plan.reason}")
    lines += [
        "",
        rec.ordering_rule,
        "files GUESSED = the card does not list the tier's files: names and shard count are "
        "derived; '?' = size approximate (the card gives no exact files).",
    ]
    return "\n".join(lines)


def to_json(rec: Recommendation, machine_name: str) -> dict[str, Any]:
    def one(tv: TierVerdict) -> dict[str, Any]:
        t = tv.tier
        plan = tv.plan
        return {
            "id": t.id,
            "name": t.name,
            "publisher": t.publisher,
            "repo": t.repo,
            "size_bytes": t.size_bytes,
            "size_exact": _exact(t),
            "experts": t.experts_kept,
            "expert_quant": t.expert_quant,
            "dense_quant": t.dense_quant,
            "vision": t.vision,
            "engines": list(t.engines),
            "reference": t.reference,
            "known": t.known,
            "files_guessed": t.files_guessed,
            "imatrix": t.imatrix,
            "quality_basis": tv.basis.text() if tv.basis else "",
            "quality_shortcomings": list(tv.basis.shortcomings) if tv.basis else [],
            "quality": [
                {"metric": q.metric, "value": q.value, "conditions": q.conditions,
                 "scope": q.scope}
                for q in t.quality
            ],
            "rank": tv.rank,
            "verdict": tv.verdict,
            "reason": tv.reason,
            "shortfall_bytes": tv.shortfall,
            "why_not": tv.why_not,
            "disk_note": tv.disk_note,
            "n_cpu_moe": plan.n_cpu_moe if plan else None,
            "expected_tps": plan.speed.expected_tps if plan else None,
            "tps_range": [plan.speed.low_tps, plan.speed.high_tps] if plan else None,
            "server_args": list(plan.server_args) if plan else None,
        }

    return {
        "hardware": machine_name,
        "recommended": rec.best.tier.id if rec.best else None,
        "closest": rec.closest.tier.id if rec.closest else None,
        "summary": rec.summary,
        "notes": list(rec.notes),
        "ordering_rule": rec.ordering_rule,
        "tiers": [one(tv) for tv in rec.verdicts],
    }
