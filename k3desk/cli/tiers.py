"""``k3desk tiers``: every published Kimi-K3 tier and whether it fits this machine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3desk.core.app.subject import judged_machine
from k3desk.core.app.tiers import TierJudgement, TierRequest, TierRow, judge_tiers
from k3desk.core.app.values import fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.services import Services
    from k3desk.core.app.values import Tier


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
    hw, subject = judged_machine(services, args.hardware)
    request = TierRequest(hw, subject, ctx=args.ctx, state_dir=services.paths.state)
    judged = judge_tiers(request, catalog.tiers)
    if args.json:
        print(json.dumps(to_json(judged, hw.label or hw.hostname or hw.source), indent=2))
        return 0
    print(render(judged, hw.label or hw.hostname or "this machine"))
    return 0


def _exact(t: Tier) -> bool:
    return t.known and t.size_exact


def _quality(row: TierRow) -> str:
    if not row.tier.quality:
        return "-"
    q = row.tier.quality[0]
    return f"{q.metric} {q.value}"


def _fit_text(row: TierRow) -> str:
    """The verdict in the words every shell uses, with the speed and the offload."""
    text = row.label
    if row.kind == "hybrid" and row.n_cpu_moe:
        text += f" (--n-cpu-moe {row.n_cpu_moe})"
    if row.speed is not None:
        text += f", ~{row.speed.text()}"
    return text


def _imatrix(t: Tier) -> str:
    return {True: "yes", False: "no", None: "?"}[t.imatrix]


def render(judged: TierJudgement, machine_name: str) -> str:
    head = ("#", "id", "tier", "publisher", "files", "size", "experts", "imatrix", "vision",
            "engines", "fit on this machine")  # fmt: skip
    rows: list[tuple[str, ...]] = [head]
    for row in judged.rows:
        t = row.tier
        experts = f"{t.experts_kept}x{t.expert_quant}"
        if t.expert_feed_forward_length != 3072:
            experts += f" (w{t.expert_feed_forward_length})"
        name = t.name + (" (ref)" if t.reference else "")
        rows.append(
            (
                str(row.verdict.rank),
                t.id,  # what `k3desk download` takes
                name,
                t.publisher,
                "card" if t.known else "GUESSED",
                fmt_bytes(t.size_bytes) + ("" if _exact(t) else "?"),
                experts,
                _imatrix(t),
                t.vision,
                ",".join(t.engines),
                _fit_text(row),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = [f"Kimi-K3 tiers for {machine_name}", ""]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)]
        lines.append("  ".join(cells) + "  " + r[-1])
    lines.insert(3, "  ".join("-" * w for w in widths) + "  " + "-" * 20)
    lines += ["", "Quality figures (as each card publishes them; not comparable across cards):"]
    for row in judged.rows:
        lines.append(f"  {row.tier.name:<16} {_quality(row)}")
    lines += ["", "What each rank rests on:"]
    for row in judged.rows:
        if row.basis_text:
            lines.append(f"  #{row.verdict.rank:<3} {row.tier.name:<16} {row.basis_text}")
    lines += ["", judged.summary]
    lines += [f"  Note: {n}" for n in judged.notes]
    chosen = judged.chosen
    for row in judged.rows:
        tv = row.verdict
        ahead = chosen is not None and tv.rank < chosen.verdict.rank
        if ahead and tv.why_not and not tv.tier.reference:
            lines.append(f"  - {tv.why_not}")
    best = judged.best
    if best is not None and best.plan is not None:
        lines.append(f"  Plan: {best.plan.reason}")
    example = chosen or (judged.rows[0] if judged.rows else None)
    if example is not None:
        lines += ["", f"Download a tier by its id: `k3desk download {example.tier.id}`."]
    lines += [
        "",
        judged.ordering_rule,
        "files GUESSED = the card does not list the tier's files: names and shard count are "
        "derived; '?' = size approximate (the card gives no exact files).",
    ]
    return "\n".join(lines)


def to_json(judged: TierJudgement, machine_name: str) -> dict[str, Any]:
    def one(row: TierRow) -> dict[str, Any]:
        t = row.tier
        tv = row.verdict
        plan = row.plan
        speed = row.speed
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
            "files_guessed": row.files_guessed,
            "imatrix": t.imatrix,
            "quality_basis": row.basis_text,
            "quality_shortcomings": list(row.basis.shortcomings) if row.basis else [],
            "quality": [
                {"metric": q.metric, "value": q.value, "conditions": q.conditions,
                 "scope": q.scope}
                for q in t.quality
            ],
            "rank": tv.rank,
            "verdict": tv.verdict,
            "verdict_text": row.label,
            "reason": tv.reason,
            "shortfall_bytes": row.shortfall,
            "stream_bytes": row.stream_bytes,
            "why_not": tv.why_not,
            "disk_note": tv.disk_note,
            "fits_disk": tv.fits_disk,
            # RAM missing for the whole model to stay resident, and how it would run then
            "memory_short_bytes": tv.memory_short,
            "resident": (
                {
                    "extra_ram_bytes": tv.resident.extra_ram,
                    "verdict": tv.resident.verdict,
                    "expected_tps": tv.resident.expected_tps,
                    "tps_range": [tv.resident.low_tps, tv.resident.high_tps],
                }
                if tv.resident is not None
                else None
            ),
            "n_cpu_moe": row.n_cpu_moe,
            "expert_layers_on_cpu": row.expert_layers_on_cpu,
            "expert_layers_on_gpu": row.expert_layers_on_gpu,
            # only for a tier that runs here (from memory, or streaming from disk)
            "expected_tps": speed.expected if speed else None,
            # with this machine's correction from its own runs (None: none to apply)
            "here_tps": speed.here if speed and speed.here > 0 else None,
            "calibration": speed.calibration if speed else "",
            "tps_range": [speed.low, speed.high] if speed else None,
            "needs": {
                n.resource.lower(): {"need_bytes": n.need, "have_bytes": n.have}
                for n in row.needs
            },
            "server_args": list(plan.server_args) if plan else None,
        }

    return {
        "hardware": machine_name,
        "judged": judged.subject.to_dict(),
        "recommended": judged.best.tier.id if judged.best else None,
        "closest": judged.closest.tier.id if judged.closest else None,
        "summary": judged.summary,
        "notes": list(judged.notes),
        "ordering_rule": judged.ordering_rule,
        "tiers": [one(row) for row in judged.rows],
    }
