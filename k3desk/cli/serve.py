"""``k3desk serve SHARD``: plan, launch and supervise llama-server in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from k3desk.core.app.engines import (
    Comparison,
    Endpoint,
    Event,
    RestartPolicy,
    SpeedTracker,
    SpeedWatcher,
    State,
    Supervisor,
    predicted_text,
)
from k3desk.core.app.local_api import (
    LOOPBACK,
    MAX_PARALLEL,
    PORT_HINT,
    RouterFront,
    api_port,
    behind_a_front,
    endpoint_spec,
    local_api,
    others_named,
    port_problem,
    start_front,
    tool_settings,
)
from k3desk.core.app.tool_conversations import tool_conversations
from k3desk.core.app.tool_settings import tool_snippets
from k3desk.core.app.values import EngineError, K3Error, ValidationError, fmt_bytes, what_is

if TYPE_CHECKING:
    from k3desk.core.app.services import Services


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="launch llama-server on a Kimi-K3 model and keep it running",
        description="Plan the launch for this machine, start llama-server on 127.0.0.1 at the "
        "local API's port (`k3desk api`), accepting your API keys and a fresh key of its own, "
        "show load progress, print the URL and keys, and restart it if it crashes.  Ctrl-C "
        "stops it cleanly.",
    )
    p.add_argument("shard", type=Path, help="the model's first shard (...-00001-of-000NN.gguf)")
    p.add_argument(
        "--cluster",
        metavar="NAME",
        help="run across a cluster instead (no SHARD): `k3desk serve --cluster NAME --engine "
        "sparkinfer|rpc` is `k3desk cluster serve NAME --engine ...` and takes its options",
    )
    p.add_argument("--mmproj", type=Path, metavar="FILE", help="vision projector for images")
    p.add_argument(
        "--hardware",
        type=Path,
        metavar="FILE",
        help="plan for this hardware file (a stand-in for GPUs this machine cannot show); "
        "kept only while that plan can run on this machine, else planned for this one",
    )
    p.add_argument(
        "--accept-slow",
        action="store_true",
        help="launch even when the model does not fit in RAM and streams its weights from "
        "disk (the warning says the seconds per token and the load time)",
    )
    p.add_argument(
        "--ctx",
        type=int,
        metavar="N",
        help="context length (default 8192, or the model's trained context if that is less)",
    )
    p.add_argument("--engine", type=Path, metavar="PATH", help="llama-server to use")
    p.add_argument(
        "--port",
        type=int,
        help="port for this run (default: the local API's, set with `k3desk api port`; "
        "0: a free one)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="requests answered at once, each with 1/N of the context (default: the local "
        "API's setting, 1); more wait their turn",
    )
    p.add_argument(
        "--tool-settings",
        action="store_true",
        help="with the URL and key, print them ready to paste for curl, the OpenAI SDK and "
        "the Anthropic SDK, with your first API key (`k3desk api create NAME`)",
    )
    p.add_argument(
        "--max-restarts", type=int, default=3, help="failed attempts in a row before giving up"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, services: Services) -> int:
    from k3desk.core.app.launch import LocalLaunchRequest, prepare_local_launch, slow_warning

    shard = args.shard.expanduser()
    what = what_is(shard)
    if what == "missing":
        raise ValidationError(
            f"Model file {shard} does not exist.", "Pass the first shard (-00001-of-000NN.gguf)."
        )
    if what:  # a folder, a FIFO (which would block whoever opens it)...
        raise ValidationError(
            f"{shard} is {what}, not a model file.", "Pass the first shard (-00001-of-000NN.gguf)."
        )
    if args.mmproj is not None and not args.mmproj.is_file():
        raise ValidationError(
            f"Projector file {args.mmproj} does not exist.",
            "Pass the tier's mmproj-*.gguf file, or leave --mmproj out to serve text only.",
        )
    if args.ctx is not None and args.ctx < 256:
        raise ValidationError(f"--ctx {args.ctx} is too small; use at least 256.")
    settings = services.settings()
    parallel = check_parallel(settings.api_parallel if args.parallel is None else args.parallel)
    port = api_port(settings) if args.port is None else args.port
    if port:  # before the minutes a plan and a load can take
        problem, hint = port_problem(port)
        if problem:
            raise EngineError(problem, hint if args.port is not None else PORT_HINT)

    launch = prepare_local_launch(
        services,
        LocalLaunchRequest(
            shard,
            mmproj=args.mmproj,
            ctx=args.ctx,
            engine=args.engine,
            configured_engine=services.configured_engine(),
            hardware_file=args.hardware,
            accept_slow=args.accept_slow,
            parallel=parallel,
        ),
    )
    prepared, plan = launch.prepared, launch.plan
    print(f"Plan: {plan.reason}")
    if plan.verdict == "stream":
        print(f"Warning: {slow_warning(plan, launch.model_name)}", flush=True)
    _say_notes((*plan.notes, *prepared.notes), predicted_text(plan.speed), plan.speed.calibration)
    exe = prepared.engine
    # the engine on loopback behind k3desk's front, which holds the address throughout
    fronted = behind_a_front(endpoint_spec(services, prepared, settings, port=port))
    spec = fronted.engine
    print(f"Engine: {exe}")
    print(f"Model: {shard} ({fmt_bytes(spec.model_bytes)})")
    print("Arguments: " + " ".join(spec.args))
    printer = _EventPrinter()
    sup = Supervisor(
        spec,
        services.paths,
        policy=RestartPolicy(max_failures=max(1, args.max_restarts)),
        on_event=printer,
        replan=prepared.replan_after_oom,
    )
    # a request naming another of My models is told which one runs; tools' conversations
    # are kept where the engine has one slot
    left = others_named(services, shard)
    conversations = tool_conversations(services, settings, parallel, _say)
    front = start_front(fronted, lambda: sup.endpoint, left_out=left, conversations=conversations)
    printer.address = f"http://{LOOPBACK}:{front.port}"
    try:
        return _foreground(
            sup,
            launch.tracker,
            tool_settings=args.tool_settings,
            services=services,
            address=lambda ep: replace(ep, port=front.port),
            # the conversation answered last is kept first, for as long as a person
            # waits for Ctrl-C (on a machine reading a token in seconds it may not be)
            before_stop=lambda: _flush(front),
        )
    finally:
        front.stop()


# how long Ctrl-C waits for the conversation answered last to be kept before the engine stops
STOP_KEEP_SECONDS = 10.0


def _flush(front: RouterFront) -> None:
    if not front.flush(STOP_KEEP_SECONDS):
        print(
            f"The conversation a tool had answered last was not kept within "
            f"{STOP_KEEP_SECONDS:.0f} s: it is read again when it goes on.",
            file=sys.stderr,
            flush=True,
        )


def _say(line: str) -> None:
    print(line, flush=True)


def _say_notes(notes: tuple[str, ...], predicted: str, calibration: str) -> None:
    for note in notes:
        print(f"  - {note}")
    print(predicted)
    if calibration:
        print(f"  {calibration}")


def check_parallel(parallel: int) -> int:
    if not 1 <= parallel <= MAX_PARALLEL:
        raise ValidationError(
            f"--parallel {parallel} is outside 1-{MAX_PARALLEL}.",
            "Each request answered at once holds its own state (about 443 MiB for Kimi-K3).",
        )
    return parallel


class _EventPrinter:
    """Each state change on one line; starts and crashes carry the attempt's number, what
    changed from the attempt before, and why."""

    def __init__(self) -> None:
        self._last = ""
        self._lock = threading.Lock()
        # where tools reach an engine behind a front (its own loopback port is no one's)
        self.address = ""

    def __call__(self, e: Event) -> None:
        if e.state is State.LOADING and e.progress is not None:
            line = f"loading: {e.progress.done:3d}% {e.progress.detail}"
        elif e.state is State.STARTING:
            line = f"attempt {e.attempt}: starting" + (f" ({e.message})" if e.message else "")
        elif e.state is State.CRASHED:
            line = f"attempt {e.attempt}: crashed: {e.message}"
        elif e.state is State.READY:
            said = f"ready at {self.address}" if self.address else e.message or "ready"
            line = f"attempt {e.attempt}: {said}"
        else:
            line = f"{e.state.value}" + (f": {e.message}" if e.message else "")
        with self._lock:
            if line != self._last:
                self._last = line
                print(line, flush=True)


def _watch_speed(tracker: SpeedTracker, ep: Endpoint) -> SpeedWatcher:
    """Print what each stretch of answers measured, next to the prediction (asking the
    engine process of ``ep`` alone, until it ends)."""

    def show(c: Comparison) -> None:
        text = c.text()
        if text:
            print(text, flush=True)

    return tracker.watch(ep.url, ep.api_key, show, pid=ep.pid)


def _foreground(
    sup: Supervisor,
    tracker: SpeedTracker | None = None,
    *,
    tool_settings: bool = False,
    services: Services | None = None,
    address: Callable[[Endpoint], Endpoint] | None = None,
    before_stop: Callable[[], None] | None = None,
) -> int:
    """Start ``sup`` and say each ready attempt until Ctrl-C; ``address`` gives the one
    tools reach (a front's) for an attempt's own; ``before_stop`` runs on Ctrl-C while the
    engine still runs."""

    stop = threading.Event()

    def on_stop(signum: int, frame: FrameType | None) -> None:
        # a flag the loop looks at, not an exception: one raised here is lost when the
        # signal is handled while a finalizer runs (a __del__, such as that of the Popen a
        # restart dropped, runs the handler inside it and only prints what it raised as
        # "ignored"), and serve would go on; a second signal changes nothing
        stop.set()

    previous = {s: signal.signal(s, on_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    watcher: SpeedWatcher | None = None
    try:
        sup.start()
        shown = 0  # the attempt whose endpoint was printed last
        while (ep := _ready(sup, stop)) is not None:
            if ep.attempt != shown:
                # the facts of the attempt that is ready (the endpoint carries them), not of
                # whichever process happens to run now: after a restart, its own start
                attempt = next(a for a in sup.history if a.number == ep.attempt)
                if shown == 0:
                    print(f"Ready in {time.monotonic() - started:.1f} s", flush=True)
                else:
                    took = attempt.ready_seconds or 0.0
                    print(f"Ready again in {took:.1f} s (attempt {ep.attempt})", flush=True)
                shown = ep.attempt
                reach = address(ep) if address else ep
                print(f"URL: {reach.url}/v1", flush=True)
                print(f"API key: {ep.api_key}", flush=True)
                if services is not None:
                    _print_client_keys(services)
                print(f"Engine pid: {ep.pid}", flush=True)
                print(f"Log: {attempt.log_file}", flush=True)
                if tool_settings:
                    _print_tool_settings(reach, services)
                print("Press Ctrl-C to stop.", flush=True)
                if tracker is not None:
                    if watcher is not None:
                        watcher.stop()
                    watcher = _watch_speed(tracker, ep)
            if sup.wait_stopped(0.5):
                crash = sup.last_crash
                raise EngineError(
                    "llama-server stopped: " + (crash.describe() if crash else "unknown reason"),
                    crash.fix if crash else f"See the log: {sup.log_file}",
                )
        print("Stopping ...", file=sys.stderr, flush=True)
        if before_stop is not None:
            before_stop()
        sup.stop()
        print("Stopped.", file=sys.stderr, flush=True)
        return 0
    finally:
        if watcher is not None:
            watcher.stop()
        sup.stop()
        _print_history(sup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _ready(sup: Supervisor, stop: threading.Event) -> Endpoint | None:
    """``sup``'s endpoint once it is ready (through restarts), None once ``stop`` is set;
    raises the error it ended with, if it ends."""
    while not stop.is_set():
        try:
            return sup.wait_ready(0.05)  # at once when ready
        except EngineError:
            if sup.wait_stopped(0):  # it ended: the error it ended with
                return sup.wait_ready(0)
    return None


def _print_client_keys(services: Services) -> None:
    """The keys the person's tools may use: they work with every launch."""
    api = local_api(services, services.settings())
    if api.warning:
        print(f"Warning: {api.warning}", flush=True)
    if api.keys:
        names = ", ".join(f"{k.name} ({k.shown})" for k in api.keys)
        print(f"Keys for your tools (the key above is this launch's): {names}", flush=True)
    else:
        print(
            "Keys for your tools: none yet (the key above is this launch's); `k3desk api "
            "create NAME` makes one that stays valid across launches.",
            flush=True,
        )


def _print_tool_settings(ep: Endpoint, services: Services | None = None) -> None:
    """The endpoint's address and key as curl and the SDKs take them, as the Engine page's
    "Copy for…" copies them: with the person's first API key, else this launch's."""
    snippets = None
    if services is not None:
        try:
            snippets = tool_settings(services, services.settings(), url=ep.url)
        except K3Error:
            snippets = None
    for snippet in snippets or tool_snippets(ep.url, ep.api_key):
        print(f"--- {snippet.label}", flush=True)
        print(snippet.text, end="", flush=True)
    print("---", flush=True)


def _print_history(sup: Supervisor) -> None:
    """Every attempt, at exit: what changed, how far it got, how it ended, what followed."""
    history = sup.history
    if not history:
        return
    print("Attempts:", flush=True)
    for a in history:
        facts = []
        if a.changes:
            facts.append(f"changed: {a.changes}")
        elif a.number > 1:
            facts.append("the same command again")
        if a.ready_seconds is not None:
            facts.append(f"ready after {a.ready_seconds:.1f} s")
        if a.crash is not None:
            facts.append(a.crash.describe())
        if a.action:
            facts.append(a.action)
        elif a.crash is None:
            facts.append("running" if a.ended_at is None else "ended")
        print(f"  attempt {a.number}: " + "; ".join(facts), flush=True)
