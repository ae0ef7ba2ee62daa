"""``k3desk serve SHARD``: plan, launch and supervise llama-server in the foreground."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from k3desk.core.engines.crash import CrashReport
from k3desk.core.engines.discovery import find_llama_server
from k3desk.core.engines.probe import probe_engine
from k3desk.core.engines.supervisor import (
    Event,
    LaunchSpec,
    RestartPolicy,
    State,
    Supervisor,
    bump_n_cpu_moe,
)
from k3desk.core.errors import EngineError, K3Error, ValidationError
from k3desk.core.units import fmt_bytes

if TYPE_CHECKING:
    from k3desk.app import Services
    from k3desk.core.gguf.model import ModelLayout
    from k3desk.core.hardware.profile import HardwareProfile
    from k3desk.core.planning.model import LaunchPlan, PlanOptions


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="launch llama-server on a Kimi-K3 model and keep it running",
        description="Plan the launch for this machine, start llama-server on 127.0.0.1 with a "
        "fresh API key, show load progress, print the URL and key, and restart it if it "
        "crashes.  Ctrl-C stops it cleanly.",
    )
    p.add_argument("shard", type=Path, help="the model's first shard (...-00001-of-000NN.gguf)")
    p.add_argument("--mmproj", type=Path, metavar="FILE", help="vision projector for images")
    p.add_argument("--hardware", type=Path, metavar="FILE", help="plan for this hardware file")
    p.add_argument("--ctx", type=int, default=8192, help="context length (default 8192)")
    p.add_argument("--engine", type=Path, metavar="PATH", help="llama-server to use")
    p.add_argument("--port", type=int, help="port (default: a free one)")
    p.add_argument(
        "--max-restarts", type=int, default=3, help="failed attempts in a row before giving up"
    )
    p.set_defaults(handler=run)


def _engine(args: argparse.Namespace, services: Services) -> tuple[Path, bool]:
    """The engine to use and whether it takes --api-key-file."""
    exe = find_llama_server(services.paths, configured=args.engine)
    if exe is None:
        raise EngineError(
            "No llama-server found.",
            "Build one with `k3desk engine install`, or pass --engine PATH.",
        )
    result = probe_engine(exe, services.paths)
    if not result.usable:
        raise EngineError(f"{exe}: {result.verdict()}", "See `k3desk engine probe` for details.")
    return exe, result.flags.get("--api-key-file", False)


def _layout(shard: Path) -> ModelLayout | None:
    """The shard set's layout (header-only validation), or None without a validator."""
    try:
        validate = importlib.import_module("k3desk.core.gguf.validate")
    except ImportError:
        return None
    layout: ModelLayout = validate.validate_shard_set(shard)
    return layout


def _plan(hw: HardwareProfile, layout: ModelLayout, opts: PlanOptions) -> LaunchPlan:
    from k3desk.core.planning.plan import make_plan

    return make_plan(hw, layout, opts)


def run(args: argparse.Namespace, services: Services) -> int:
    shard = args.shard.expanduser()
    if not shard.is_file():
        raise ValidationError(
            f"Model file {shard} does not exist.", "Pass the first shard (-00001-of-000NN.gguf)."
        )
    if args.mmproj is not None and not args.mmproj.is_file():
        raise ValidationError(f"Projector file {args.mmproj} does not exist.")
    if args.ctx < 256:
        raise ValidationError(f"--ctx {args.ctx} is too small; use at least 256.")
    exe, key_file = _engine(args, services)

    layout = _layout(shard)
    model_bytes = sum(p.stat().st_size for p in shard.parent.glob("*.gguf"))
    n_layers = 0
    replan = None
    if layout is not None:
        from k3desk.core.planning.model import PlanOptions

        hw = (
            services.load_hardware(args.hardware)
            if args.hardware
            else services.detect_hardware(measure_bandwidth=False)
        )
        opts = PlanOptions(ctx=args.ctx, mmproj=args.mmproj)
        plan = _plan(hw, layout, opts)
        if plan.verdict == "no-fit":
            raise K3Error(
                f"{shard.name} does not fit this machine: {plan.reason}",
                "See `k3desk plan` for the numbers, or choose a smaller tier.",
            )
        server_args = tuple(plan.server_args)
        model_bytes = layout.total_file_bytes
        n_layers = len(layout.layers)
        print(f"Plan: {plan.reason}")
        for note in plan.notes:
            print(f"  - {note}")

        def replan_fn(
            crash: CrashReport, current: tuple[str, ...]
        ) -> tuple[tuple[str, ...], str] | None:
            if crash.recovery != "replan_cpu_moe":
                return None
            bumped = bump_n_cpu_moe(current, n_layers)
            if bumped is None:
                return None
            new_n = int(bumped[0][bumped[0].index("--n-cpu-moe") + 1])
            try:
                again = _plan(hw, layout, _with_n_cpu_moe(opts, new_n))
            except K3Error:
                return bumped
            return tuple(again.server_args), bumped[1]

        replan = replan_fn
    else:
        server_args = ("-m", str(shard), "-c", str(args.ctx), "--jinja")
        if args.mmproj is not None:
            server_args += ("--mmproj", str(args.mmproj))
        print("Plan: planner unavailable; starting with llama-server's own defaults.")
    print(f"Engine: {exe}")
    print(f"Model: {shard} ({fmt_bytes(model_bytes)})")
    print("Arguments: " + " ".join(server_args))

    spec = LaunchSpec(
        exe,
        server_args,
        model_bytes=model_bytes,
        port=args.port,
        n_layers=n_layers,
        api_key_file=key_file,
    )
    printer = _EventPrinter()
    sup = Supervisor(
        spec,
        services.paths,
        policy=RestartPolicy(max_failures=max(1, args.max_restarts)),
        on_event=printer,
        replan=replan,
    )
    return _foreground(sup)


class _EventPrinter:
    def __init__(self) -> None:
        self._last = ""
        self._lock = threading.Lock()

    def __call__(self, e: Event) -> None:
        if e.state is State.LOADING and e.progress is not None:
            line = f"loading: {e.progress.done:3d}% {e.progress.detail}"
        elif e.state is State.CRASHED:
            line = f"crashed: {e.message}"
        else:
            line = f"{e.state.value}" + (f": {e.message}" if e.message else "")
        with self._lock:
            if line != self._last:
                self._last = line
                print(line, flush=True)


def _foreground(sup: Supervisor) -> int:
    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    previous_int = signal.getsignal(signal.SIGINT)
    started = time.monotonic()
    try:
        sup.start()
        shown_pid = 0
        while True:
            try:
                ep = sup.wait_ready()
            except EngineError:
                _print_history(sup)
                raise
            pid = sup.pid or 0
            if pid != shown_pid:
                shown_pid = pid
                print(f"Ready in {time.monotonic() - started:.1f} s", flush=True)
                print(f"URL: {ep.url}/v1", flush=True)
                print(f"API key: {ep.api_key}", flush=True)
                print(f"Engine pid: {pid}", flush=True)
                print(f"Log: {sup.log_file}", flush=True)
                print("Press Ctrl-C to stop.", flush=True)
            if sup.wait_stopped(0.5):
                _print_history(sup)
                crash = sup.last_crash
                raise EngineError(
                    "llama-server stopped: " + (crash.describe() if crash else "unknown reason"),
                    crash.fix if crash else f"See the log: {sup.log_file}",
                )
    except KeyboardInterrupt:
        # a second Ctrl-C or SIGTERM must not cut the clean stop short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("Stopping ...", file=sys.stderr, flush=True)
        sup.stop()
        print("Stopped.", file=sys.stderr, flush=True)
        return 0
    finally:
        sup.stop()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def _print_history(sup: Supervisor) -> None:
    for a in sup.history:
        what = a.crash.describe() if a.crash else "ok"
        print(f"  attempt {a.number}: {what}" + (f" -> {a.action}" if a.action else ""))


def _with_n_cpu_moe(opts: PlanOptions, n: int) -> PlanOptions:
    from dataclasses import replace

    return replace(opts, n_cpu_moe=n)
