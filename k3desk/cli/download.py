"""``k3desk download``: fetch a tier (or any repo's files) from the Hugging Face Hub.

Prints a preflight summary, then a progress bar; ``--json`` prints one JSON
object per event instead (the last one is ``{"kind": "done", ...}``).  Ctrl-C
pauses: partial files are kept and running the same command resumes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from k3desk.cli import control
from k3desk.core.app.values import Cancelled, K3Error, fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.downloads import DownloadEvent, DownloadRequest, DownloadSummary
    from k3desk.core.app.services import Services

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """``"64M"`` / ``"256KiB"`` / ``"1.5G"`` / ``"1048576"`` -> bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 64M, 512K, 2G)")
    unit = (m.group(2) or "").lower()[:1]
    return int(float(m.group(1)) * _UNITS[unit])


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "download",
        help="download a tier's shards from the Hugging Face Hub (resumable, verified)",
        description="Download a tier's GGUF shards, projector and template from the Hugging "
        "Face Hub: checks disk space first, reuses files already downloaded (here or by `hf "
        "download`), transfers several files at once, verifies every SHA-256 and resumes "
        "after an interruption. Honours HF_ENDPOINT and HF_TOKEN.",
    )
    p.add_argument("tier", nargs="?", metavar="TIER_ID", help="tier id (see `k3desk tiers`)")
    p.add_argument("--repo", help="download from this Hub repo instead of a tier")
    p.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATTERN",
        help="with --repo: files to fetch, as `hf download --include` (repeatable)",
    )
    p.add_argument(
        "--no-projector",
        action="store_true",
        help="with --repo: leave out the set's vision projector (brought by default when the "
        "repository has one for it)",
    )
    p.add_argument(
        "--projector-for",
        type=Path,
        metavar="SHARD",
        help="download only the vision projector of the set SHARD is part of (a set k3desk "
        "downloaded without it), into its folder",
    )
    p.add_argument("--to", type=Path, metavar="DIR", help="target folder (default: models folder)")
    p.add_argument("--revision", help="branch, tag or commit (default: main)")
    p.add_argument(
        "--parallel", type=int, default=8, metavar="N", help="files transferred at once (8)"
    )
    p.add_argument("--json", action="store_true", help="print JSON-lines events, no bar")
    p.add_argument(
        "--transport",
        choices=("auto", "http", "hub"),
        default="auto",
        help="auto: hf_xet for Xet-backed files, resumable HTTP otherwise; http: always "
        "resumable HTTP; hub: always huggingface_hub's own downloader",
    )
    p.add_argument(
        "--xet-high-performance",
        action="store_true",
        help="let hf_xet use more connections and memory (HF_XET_HIGH_PERFORMANCE=1)",
    )
    p.add_argument(
        "--stall-seconds",
        type=float,
        default=30.0,
        metavar="S",
        help="reconnect a transfer that received nothing for S seconds (30)",
    )
    p.add_argument(
        "--resume-chunk",
        type=parse_size,
        default="64M",
        metavar="SIZE",
        help="how often partial files are made durable; at most this much is fetched again "
        "after a crash or power cut (64M)",
    )
    p.add_argument(
        "--margin",
        type=parse_size,
        default="2G",
        metavar="SIZE",
        help="free space to keep beyond what the download needs (2G)",
    )
    p.add_argument(
        "--no-hf-cache",
        action="store_true",
        help="do not reuse files from the Hugging Face cache (HF_HOME)",
    )
    p.set_defaults(handler=run)


def _request(args: argparse.Namespace, services: Services) -> tuple[DownloadRequest, str]:
    """The request, and what is said first about the set's projector."""
    from k3desk.core.app.downloads import DownloadRequest
    from k3desk.core.app.hub_choice import projector_note

    if args.repo:
        if args.tier:
            raise K3Error("Give either a TIER_ID or --repo, not both.")
        if not args.include:
            raise K3Error(
                f"--repo {args.repo} needs at least one --include PATTERN.",
                "Example: --include 'Kimi-K3-UD-IQ1_S-*.gguf'",
            )
        req = DownloadRequest(
            repo=args.repo,
            allow_patterns=tuple(args.include),
            revision=args.revision or "main",
            label=args.repo,
            # the set the first pattern selects comes with its projector, as in the app
            projector_of="" if args.no_projector else args.include[0],
        )
        return req, "" if args.no_projector else projector_note(None)
    if not args.tier:
        raise K3Error(
            "Which tier? Give a TIER_ID (see `k3desk tiers`) or --repo with --include.",
        )
    if "/" in args.tier and args.tier not in services.catalog.ids:
        raise _repository_given(args.tier, services)
    tier = services.catalog.get(args.tier)
    return DownloadRequest.from_tier(tier, revision=args.revision), projector_note(tier)


def _projector_request(shard: Path) -> tuple[DownloadRequest, Path]:
    """``--projector-for SHARD``: its set's projector, into the set's folder."""
    from k3desk.core.app.hub_choice import projector_download

    if not shard.is_file():
        raise K3Error(f"{shard} is not a file.", "Give the first part of a downloaded set.")
    chosen = projector_download(shard)
    if chosen is None:
        raise K3Error(
            f"k3desk cannot tell which repository {shard.name} came from, or its folder "
            "holds a projector already.",
            "Download a projector by hand: k3desk download --repo REPO --include "
            "'mmproj*.gguf' --to FOLDER.",
        )
    return chosen.request, chosen.target


def _repository_given(repo: str, services: Services) -> K3Error:
    """What to say when a Hub repository (``owner/name``) is given where a tier id goes:
    the tiers that repository holds, else ``--repo`` with ``--include``."""
    tiers = [t for t in services.catalog.tiers if t.repo.lower() == repo.strip("/").lower()]
    if tiers:
        ids = ", ".join(t.id for t in tiers)
        return K3Error(
            f"'{repo}' is a Hub repository, not a tier id; the catalog's tiers from it: {ids}.",
            f"Download one by its id (`k3desk download {tiers[0].id}`), or any of its files "
            f"with --repo {repo} --include PATTERN.",
        )
    return K3Error(
        f"'{repo}' looks like a Hub repository, not a tier id (see `k3desk tiers`).",
        f"To download from a repository, name it with --repo and its files with --include: "
        f"k3desk download --repo {repo} --include 'SET-*.gguf' (`k3desk search` lists the "
        "sets a repository holds).",
    )


def run(args: argparse.Namespace, services: Services) -> int:
    from k3desk.core.app.downloads import DownloadOptions, TokenStore, start_download

    if args.parallel < 1:
        raise K3Error(f"--parallel must be at least 1 (got {args.parallel}).")
    if args.projector_for is not None:
        request, to = _projector_request(args.projector_for)
        note = ""
    else:
        (request, note), to = _request(args, services), args.to
    tokens = TokenStore()
    options = DownloadOptions(
        parallel=args.parallel,
        transport=args.transport,
        xet_high_performance=args.xet_high_performance,
        stall_seconds=args.stall_seconds,
        checkpoint_bytes=max(64 * 1024, args.resume_chunk),
        margin_bytes=args.margin,
        use_hf_cache=not args.no_hf_cache,
    )
    out = JsonOut(sys.stdout) if args.json else TextOut(sys.stderr, sys.stdout)
    # without --to: the models folder's folder named after the tier (or the repo)
    job = start_download(services, request, to, tokens=tokens, options=options, on_event=out.event)
    target = job.target
    if not args.json:
        who = f"with the token from {tokens.source()}" if job.options.token else "without a token"
        what = (
            request.repo
            if request.label in ("", request.repo)
            else (f"{request.label} from {request.repo}")
        )
        print(f"Downloading {what} to {target} ({who})", file=sys.stdout)
        if note:
            print(note, file=sys.stdout)
    try:
        with _pause_on_signals(job.pause), _events_only():
            summary = job.run()
    except Cancelled:
        out.close()
        out.paused(target)
        return 130
    except K3Error as exc:
        out.close()
        out.error(exc)
        raise
    out.close()
    out.done(summary)
    return 0


@contextmanager
def _events_only() -> Iterator[None]:
    """Warnings reach the user once, as events; the job also logs them, and with no
    logging configured Python would print each a second time, raw, on stderr."""
    logger = logging.getLogger("k3desk.core.hub")
    quiet = logging.NullHandler()
    logger.addHandler(quiet)
    try:
        yield
    finally:
        logger.removeHandler(quiet)


@contextmanager
def _pause_on_signals(pause: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C / SIGTERM pause the job (partials kept) instead of killing it mid-write."""
    old: dict[signal.Signals, Any] = {}

    def handler(signum: int, frame: object) -> None:
        pause()

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


# ------------------------------------------------------------------ output


def _event_dict(event: DownloadEvent) -> dict[str, Any]:
    data = dataclasses.asdict(event)
    kind = data.pop("kind")
    return {"kind": kind, **data}


class JsonOut:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def _line(self, data: dict[str, Any]) -> None:
        self.stream.write(json.dumps(data) + "\n")
        self.stream.flush()

    def event(self, event: DownloadEvent) -> None:
        self._line(_event_dict(event))

    def paused(self, target: Path) -> None:
        self._line({"kind": "paused", "target": str(target)})

    def error(self, exc: K3Error) -> None:
        self._line({"kind": "error", "message": exc.message, "hint": exc.hint})

    def done(self, summary: DownloadSummary) -> None:
        pass  # the Done event already carried the summary

    def close(self) -> None:
        pass


def _clock(seconds: float | None) -> str:
    """``h:mm:ss``; ``--:--`` while the rate is unknown and ``< 1 s`` near the end
    (a bar reading ``0:00:00`` with bytes still to come looks stuck)."""
    if seconds is None:
        return "--:--"
    if seconds < 1:
        return "< 1 s"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class TextOut:
    """A one-line progress bar on a terminal; plain lines otherwise."""

    def __init__(self, bar: TextIO, out: TextIO) -> None:
        self.bar = bar
        self.out = out
        self.tty = bar.isatty()
        self.files_total = 0
        self.files_done = 0
        self._last = 0.0
        self._drawn = False
        self._progress: tuple[int, int, float, float | None] = (0, 0, 0.0, None)

    def _clear(self) -> None:
        if self._drawn:
            control(self.bar, "\r\033[K")
            self._drawn = False

    def _print(self, text: str) -> None:
        self._clear()
        print(text, file=self.out, flush=True)
        self._draw()

    def _draw(self) -> None:
        done, total, speed, eta = self._progress
        if not self.tty or total <= 0:
            return
        frac = min(1.0, done / total)
        width = 24
        filled = int(frac * width)
        rate = f"{fmt_bytes(speed)}/s" if speed > 0 else "measuring speed"  # first 2 s
        line = (
            f"{frac * 100:5.1f}% [{'#' * filled}{'-' * (width - filled)}] "
            f"{fmt_bytes(done)}/{fmt_bytes(total)}  {rate}  "
            f"ETA {_clock(eta)}  {self.files_done}/{self.files_total} files"
        )
        control(self.bar, "\r\033[K")
        self.bar.write(line)
        self.bar.flush()
        self._drawn = True

    def event(self, e: DownloadEvent) -> None:
        if e.kind == "listing":
            self.files_total = e.files
            self._print(
                f"Listed {e.files} files, {fmt_bytes(e.total_bytes)}, at commit {e.revision[:12]}"
            )
        elif e.kind == "preflight":
            self._print(
                f"Preflight: {fmt_bytes(e.free_bytes)} free on {e.filesystem or 'disk'}, "
                f"{fmt_bytes(e.needed_bytes)} needed (+{fmt_bytes(e.margin_bytes)} margin); "
                f"{e.to_fetch} to fetch ({fmt_bytes(e.fetch_bytes)}"
                + (
                    f", resuming {fmt_bytes(e.partial_bytes)} already here"
                    if e.partial_bytes
                    else ""
                )
                + f"), {e.reuse} already present or cached"
            )
            # the set's size, what is here already counted done (the same total on a resume)
            total = e.have_bytes + e.fetch_bytes
            self._progress = (e.have_bytes, total, 0.0, None)
        elif e.kind == "file_progress":
            if e.phase == "download":
                self._progress = (e.overall_done, e.overall_total, e.overall_speed, e.overall_eta)
            now = time.monotonic()
            if now - self._last >= 0.2:
                self._last = now
                self._draw()
        elif e.kind == "warning":
            self._print(f"warning: {e.message}")
        elif e.kind == "hub_waiting":
            if e.waiting:
                self._print(f"Waiting for the Hub: no data for {e.seconds:.0f} s ({e.reason}).")
            else:
                self._print("The Hub answers again.")
        elif e.kind == "stalled":
            self._print(f"{e.path}: no data for {e.seconds:.0f} s at byte {e.at_byte:,}")
        elif e.kind == "retrying":
            self._print(
                f"{e.path}: retrying in {e.wait:.0f} s ({e.reason}; attempt {e.attempt} of "
                f"{e.max_attempts})"
            )
        elif e.kind == "verified" and not e.ok:
            self._print(
                f"{e.path}: hash mismatch (expected {e.expected[:16]}…, got {e.actual[:16]}…)"
            )
        elif e.kind == "file_done":
            self.files_done += 1
            how = {
                "state": "already verified",
                "existing": "already here, verified",
                "hf-cache": "from the Hugging Face cache, verified",
                "download": "downloaded, verified",
            }[e.source]
            if not self.tty or e.source == "download":
                self._print(f"  {e.path} ({fmt_bytes(e.size)}): {how}")
            else:
                self._draw()

    def close(self) -> None:
        self._clear()

    def paused(self, target: Path) -> None:
        print(
            f"Paused. Partial files are kept in {target}; run the same command again to resume.",
            file=self.out,
        )

    def error(self, exc: K3Error) -> None:
        pass  # the CLI prints the message and hint

    def done(self, s: DownloadSummary) -> None:
        speed = f", {fmt_bytes(s.average_speed)}/s" if s.fetched_bytes else ""
        print(
            f"Done: {s.files} files ({fmt_bytes(s.total_bytes)}) in {s.target}, all hashes "
            f"verified. Fetched {fmt_bytes(s.fetched_bytes)} in {s.seconds:.1f} s{speed}; "
            f"{s.reused_files} reused.",
            file=self.out,
        )
        if s.refetched:
            print(f"Fetched again after a hash mismatch: {', '.join(s.refetched)}", file=self.out)
        if s.warnings:
            print(f"{len(s.warnings)} warning(s):", file=self.out)
            for w in s.warnings:
                print(f"  - {w}", file=self.out)
