"""``k3desk plan SHARD``: where each layer goes, the llama-server command, memory and speed."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3desk.core.engines.launch import plan_model, suspicious_note
from k3desk.core.errors import CatalogError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.gguf.validate import inspect_shard_set
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.model import LaunchPlan, LayerPlacement, PlanOptions
from k3desk.core.planning.speed import speed_lines
from k3desk.core.tuning.calibration import CalibrationStore, calibrate_plan
from k3desk.core.tuning.tuned import TunedStore, apply_tuned
from k3desk.core.units import GiB, fmt_bytes

if TYPE_CHECKING:
    from k3desk.app import Services
    from k3desk.core.catalog.model import Tier


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="plan a llama-server launch for a downloaded shard set on this machine",
        description="Read the shard set's headers, then decide where every layer goes "
        "(GPU, RAM, or streamed from disk), print the llama-server command, the memory "
        "per device, a per-layer map and the expected decode speed.",
    )
    p.add_argument("shard", type=Path, help="part 1 (or any part) of the shard set")
    p.add_argument(
        "--hardware",
        type=Path,
        metavar="FILE",
        help="plan for the machine in FILE (`k3desk doctor --json` output) instead of this one",
    )
    p.add_argument(
        "--ctx",
        type=int,
        metavar="N",
        help="context size (default 8192, or the model's trained context if that is less)",
    )
    p.add_argument("--mmproj", type=Path, metavar="FILE", help="vision projector to load as well")
    p.add_argument(
        "--n-cpu-moe",
        type=int,
        metavar="N",
        help="keep the experts of layers 0..N-1 in RAM (default: the smallest N that fits)",
    )
    p.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    p.set_defaults(handler=run)


def machine(args: argparse.Namespace, services: Services, disk: Path | None) -> HardwareProfile:
    """The --hardware file, or this machine detected once."""
    if args.hardware is not None:
        return services.load_hardware(args.hardware)
    return services.detect_hardware(disk)


def catalog_tiers(services: Services) -> tuple[Tier, ...]:
    with contextlib.suppress(CatalogError, OSError):
        return tuple(services.catalog.tiers)
    return ()


def run(args: argparse.Namespace, services: Services) -> int:
    tiers = catalog_tiers(services)
    report = inspect_shard_set(args.shard, tiers=tiers)
    layout = report.layout
    for finding in report.suspicious:  # planned all the same: the engine decides
        print(suspicious_note(finding), file=sys.stderr)
    hw = machine(args, services, layout.first_part.parent)
    opts = PlanOptions(ctx=args.ctx, mmproj=args.mmproj, n_cpu_moe=args.n_cpu_moe)
    opts, tuned_note = apply_tuned(TunedStore(services.paths.state), hw, layout, opts)
    plan, tier = plan_model(hw, layout, opts, tiers)
    plan = calibrate_plan(CalibrationStore(services.paths.state), hw, layout, plan)
    if tuned_note:
        plan = replace(plan, notes=(tuned_note, *plan.notes))
    if args.json:
        data: dict[str, Any] = {
            "model": str(layout.first_part),
            "parts": len(layout.parts),
            "tier": tier.id if tier else None,
            "hardware": hw.label or hw.hostname or hw.source,
            "command": shlex.join(plan.argv()),
            "suspicious": list(report.suspicious),
            **plan.to_dict(),
        }
        print(json.dumps(data, indent=2, default=str))
        return 0
    print(render(plan, layout, hw, tier))
    return 0


# ------------------------------------------------------------------ text


def _gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def memory_table(plan: LaunchPlan) -> list[str]:
    head = ("device", "budget", "weights", "KV", "state", "compute", "other", "used", "free")
    rows = [head]
    for d in plan.devices:
        rows.append(
            (
                d.device,
                _gib(d.capacity),
                _gib(d.weights),
                _gib(d.kv_cache),
                _gib(d.recurrent_state),
                _gib(d.compute),
                _gib(d.other),
                _gib(d.used),
                _gib(d.headroom),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  " + "  ".join(cells))
    lines.insert(1, "  " + "  ".join("-" * w for w in widths))
    return lines


def _runs(items: Sequence[tuple[int, str]]) -> list[tuple[int, int, str]]:
    runs: list[tuple[int, int, str]] = []
    for index, device in items:
        if runs and runs[-1][2] == device and runs[-1][1] == index - 1:
            runs[-1] = (runs[-1][0], index, device)
        else:
            runs.append((index, index, device))
    return runs


def _span(a: int, b: int) -> str:
    return f"{a}" if a == b else f"{a}-{b}"


def _devices(devs: Sequence[str]) -> str:
    if len(devs) == 1:
        return devs[0]
    nums = [int(d[4:]) for d in devs]
    if all(d.startswith("CUDA") for d in devs) and nums == list(range(nums[0], nums[-1] + 1)):
        return f"CUDA{nums[0]}..{nums[-1]}"
    return ",".join(devs)


def layer_map(layers: Sequence[LayerPlacement]) -> list[str]:
    """Compact ranges: 'experts: layers 1-27 CUDA0..7, 28-92 RAM'."""

    def compress(items: list[tuple[int, str]]) -> str:
        # merge consecutive GPU runs into one span with a device range
        merged: list[tuple[int, int, list[str]]] = []
        for a, b, dev in _runs(items):
            gpu = dev.startswith("CUDA")
            if merged and gpu and merged[-1][2][-1].startswith("CUDA") and merged[-1][1] == a - 1:
                merged[-1] = (merged[-1][0], b, [*merged[-1][2], dev])
            else:
                merged.append((a, b, [dev]))
        return ", ".join(f"{_span(a, b)} {_devices(d)}" for a, b, d in merged)

    non_expert = [(p.index, p.non_expert_device) for p in layers]
    experts = [(p.index, p.expert_device) for p in layers if p.expert_device != "none"]
    dense = [p.index for p in layers if p.ffn == "dense"]
    lines = [f"  attention + shared: layers {compress(non_expert)}"]
    if experts:
        lines.append(f"  routed experts:     layers {compress(experts)}")
    if dense:
        lines.append(
            f"  (layer{'s' if len(dense) > 1 else ''} {', '.join(map(str, dense))}: dense FFN)"
        )
    per_gpu = _runs(non_expert)
    if len(per_gpu) > 1:
        lines.append(
            "  per device:         " + ", ".join(f"{dev} {_span(a, b)}" for a, b, dev in per_gpu)
        )
    return lines


def render(plan: LaunchPlan, layout: ModelLayout, hw: HardwareProfile, tier: Tier | None) -> str:
    machine_name = hw.label or hw.hostname or "this machine"
    what = f"{tier.publisher} {tier.name}" if tier else (layout.name or layout.first_part.name)
    s = plan.speed
    lines = [
        f"k3desk plan: {what} ({fmt_bytes(layout.total_file_bytes)}, {len(layout.parts)} "
        f"part{'s' if len(layout.parts) != 1 else ''}) on {machine_name}",
        "",
        f"Verdict: {plan.verdict}",
        f"  {plan.reason}",
        "",
        "Command:",
        f"  {shlex.join(plan.argv())}",
        "",
        f"Memory (GiB), context {plan.ctx}:",
        *memory_table(plan),
        "",
        "Layers:",
        *layer_map(plan.layers),
        "",
        *speed_lines(s),
    ]
    if plan.notes:
        lines += ["", "Notes:", *(f"  - {n}" for n in plan.notes)]
    return "\n".join(lines)
