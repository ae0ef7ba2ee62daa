"""``k3desk plan SHARD``: where each layer goes, the llama-server command, memory and speed."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3desk.core.app.engines import speed_lines
from k3desk.core.app.hardware import HardwareProfile
from k3desk.core.app.remote_plan import (
    EngineEstimate,
    RemotePlan,
    RemotePlanRequest,
    engine_estimate,
    parse_remote,
    plan_remote_set,
)
from k3desk.core.app.shardplan import PlanRequest, PlanView, ShardSetPlan, plan_shard_set
from k3desk.core.app.values import GiB, K3Error, fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.services import Services


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="plan a llama-server launch for a downloaded shard set on this machine",
        description="Read the shard set's headers, then decide where every layer goes "
        "(GPU, RAM, or streamed from disk), print the llama-server command, the memory "
        "per device, a per-layer map and the expected decode speed.",
    )
    p.add_argument("shard", type=Path, nargs="?", help="part 1 (or any part) of the shard set")
    p.add_argument(
        "--remote",
        metavar="REPO[@REV]",
        help="plan a set on the Hub from its real headers, read by HTTP ranges, before "
        "downloading it (a few MB; cached per commit)",
    )
    p.add_argument(
        "--include",
        metavar="PATTERN",
        help="with --remote: the set to plan, as `k3desk download --include` selects it",
    )
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
    p.add_argument(
        "--fit-params",
        action="store_true",
        help="also ask the engine's llama-fit-params what the launch needs per device on "
        "this machine (it reads the headers only: with --remote, of the header twin)",
    )
    p.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    p.set_defaults(handler=run)


def machine(args: argparse.Namespace, services: Services, disk: Path | None) -> HardwareProfile:
    """The --hardware file, or this machine detected once."""
    if args.hardware is not None:
        return services.load_hardware(args.hardware)
    return services.detect_hardware(disk)


def run(args: argparse.Namespace, services: Services) -> int:
    _check_args(args)
    remote, planned = _plan(args, services)
    engine = engine_estimate(services, planned) if args.fit_params else None
    if args.fit_params and engine is None:
        print(
            "note: no llama-fit-params beside the engine's llama-server; "
            "the engine's own estimate is left out",
            file=sys.stderr,
        )
    for note in planned.notes:  # planned all the same: the engine decides
        print(note, file=sys.stderr)
    if args.json:
        print(json.dumps(_plan_json(planned, remote, engine), indent=2, default=str))
        return 0
    print(render(planned, remote.argv() if remote else None))
    if engine is not None:
        print("")
        print(f"The engine's own estimate ({engine.tool.name}, MiB):")
        for d in engine.devices:
            print(f"  {d.device}: model {d.model:,}, context {d.context:,}, compute {d.compute:,}")
    if remote is not None:
        print("")
        print(remote_text(remote))
    return 0


def _check_args(args: argparse.Namespace) -> None:
    """Refuse the combinations of arguments that do not go together."""
    if (args.remote is None) == (args.shard is None):
        raise K3Error(
            "Give either a SHARD file or --remote REPO[@REV].",
            "Example: k3desk plan --remote GrEarl/Kimi-K3-GGUF-IQ1_S",
        )
    if args.include and args.remote is None:
        raise K3Error("--include goes with --remote REPO[@REV].")
    if args.mmproj is not None and args.remote is not None:
        raise K3Error("--mmproj is for a downloaded set; leave it out with --remote.")
    if args.fit_params and args.hardware is not None:
        raise K3Error(
            "--fit-params measures this machine's devices; it does not go with --hardware.",
            "Leave out --hardware to compare with the engine on this machine.",
        )


def _plan(args: argparse.Namespace, services: Services) -> tuple[RemotePlan | None, ShardSetPlan]:
    """The set on the Hub (--remote, with its headers) or the downloaded SHARD set, planned."""
    if args.remote is None:
        planned = plan_shard_set(
            services,
            PlanRequest(
                args.shard,
                hardware_file=args.hardware,
                ctx=args.ctx,
                mmproj=args.mmproj,
                n_cpu_moe=args.n_cpu_moe,
            ),
        )
        return None, planned
    from k3desk.cli.search import tty_progress

    repo, rev = parse_remote(args.remote)
    show, clear = tty_progress(args.json)
    try:
        remote = plan_remote_set(
            services,
            RemotePlanRequest(
                repo,
                rev,
                include=args.include,
                hardware_file=args.hardware,
                ctx=args.ctx,
                n_cpu_moe=args.n_cpu_moe,
            ),
            progress=show,
        )
    finally:
        clear()
    return remote, remote.planned


def _plan_json(
    planned: ShardSetPlan, remote: RemotePlan | None, engine: EngineEstimate | None
) -> dict[str, Any]:
    """What --json prints: the whole plan, the set on the Hub and the engine's estimate."""
    layout, hw, plan, tier = planned.layout, planned.hardware, planned.plan, planned.tier
    data: dict[str, Any] = {
        "model": str(remote.download_path if remote else layout.first_part),
        "parts": len(layout.parts),
        "tier": tier.id if tier else None,
        "hardware": hw.label or hw.hostname or hw.source,
        "judged": planned.subject.to_dict(),
        "command": shlex.join(remote.argv() if remote else plan.argv()),
        "verdict_text": planned.view.label,
        "expert_layers_on_cpu": planned.view.expert_layers_on_cpu,
        "suspicious": list(planned.suspicious),
        "basis": remote.basis if remote is not None else "files",
        **plan.to_dict(),
    }
    if remote is not None:
        data["remote"] = remote_json(remote)
    if engine is not None:
        data["engine_memory_mib"] = [
            {"device": d.device, "model": d.model, "context": d.context, "compute": d.compute}
            for d in engine.devices
        ]
    return data


def remote_json(remote: RemotePlan) -> dict[str, Any]:
    h = remote.headers
    return {
        "repo": h.repo,
        "revision": h.revision,
        "set": remote.remote.name,
        "include": remote.remote.include,
        "header_twin": str(remote.first_part),
        "header_bytes_read": h.received,
        "requests": h.requests,
        "cached": h.cached,
        "seconds": round(h.seconds, 3),
        "projectors": list(remote.projectors),
    }


def remote_text(remote: RemotePlan) -> str:
    h = remote.headers
    return "\n".join(
        [
            f"Planned before download: {h.repo} at {h.revision[:12]}, {remote.remote.name}",
            f"  {remote.basis_text()}.",
            f"  Header twin: {remote.first_part}",
            f"  Download it with: k3desk download --repo {h.repo} --revision {h.revision} "
            f"--include '{remote.remote.include}'",
        ]
    )


# ------------------------------------------------------------------ text


def _gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def memory_table(view: PlanView) -> list[str]:
    head = ("device", "budget", "weights", "KV", "state", "compute", "other", "used", "free")
    rows = [head]
    for d in view.memory:
        rows.append(
            (
                d.device,
                _gib(d.budget),
                _gib(d.weights),
                _gib(d.kv_cache),
                _gib(d.recurrent_state),
                _gib(d.compute),
                _gib(d.other),
                _gib(d.used),
                _gib(d.free),
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


def layer_map(view: PlanView) -> list[str]:
    """Compact ranges: 'routed experts: layers 1-27 CUDA0..7, 28-92 RAM'."""
    lines = [f"  attention + shared: layers {', '.join(s.text() for s in view.attention)}"]
    if view.experts:
        lines.append(f"  routed experts:     layers {', '.join(s.text() for s in view.experts)}")
    dense = view.dense_layers
    if dense:
        lines.append(
            f"  (layer{'s' if len(dense) > 1 else ''} {', '.join(map(str, dense))}: dense FFN)"
        )
    if len(view.per_device) > 1:
        lines.append(
            "  per device:         "
            + ", ".join(f"{s.devices_text()} {s.layers_text()}" for s in view.per_device)
        )
    return lines


def render(planned: ShardSetPlan, argv: list[str] | None = None) -> str:
    layout, view, plan = planned.layout, planned.view, planned.plan
    machine_name = planned.subject.name or "this machine"
    s = plan.speed
    lines = [
        f"k3desk plan: {planned.model_name} ({fmt_bytes(layout.total_file_bytes)}, "
        f"{len(layout.parts)} part{'s' if len(layout.parts) != 1 else ''}) on {machine_name}",
        "",
        f"Verdict: {view.label}",
        f"  {plan.reason}",
        "",
        "Command:" if argv is None else "Command, once downloaded:",
        f"  {shlex.join(argv if argv is not None else plan.argv())}",
        "",
        f"Memory (GiB), context {plan.ctx}:",
        *memory_table(view),
        "",
        "Layers:",
        *layer_map(view),
        f"  {view.experts_text()}",
        "",
        *speed_lines(s),
    ]
    if plan.notes:
        lines += ["", "Notes:", *(f"  - {n}" for n in plan.notes)]
    return "\n".join(lines)
