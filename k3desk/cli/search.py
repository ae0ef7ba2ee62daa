"""``k3desk search [QUERY]``: the Kimi-K3 GGUF sets on the Hub, each judged for this machine."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3desk.cli import control
from k3desk.core.app.search import (
    SearchRequest,
    SearchResult,
    SetRow,
    search_hub,
    shown,
    size_text,
)

if TYPE_CHECKING:
    from k3desk.core.app.services import Services
    from k3desk.core.app.values import Progress


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "search",
        help="find Kimi-K3 GGUF sets on the Hub and judge each for this machine",
        description="Search the Hugging Face Hub for Kimi-K3 GGUF repositories, group each "
        "one's files into shard sets, and judge every set for this machine (or --hardware "
        "FILE) from its real GGUF headers, read by HTTP ranges before anything is "
        "downloaded (a few MB per set, cached per commit). Sets that are a catalog tier "
        "carry the card's facts. Offline, the catalog alone is shown, and says so.",
    )
    p.add_argument("query", nargs="?", default="Kimi-K3", help="text to search for (Kimi-K3)")
    p.add_argument(
        "--base-model", metavar="REPO", help="only repositories quantized from this model"
    )
    p.add_argument(
        "--hardware",
        type=Path,
        metavar="FILE",
        help="judge for the machine in FILE (`k3desk doctor --json` output)",
    )
    p.add_argument(
        "--no-headers",
        action="store_true",
        help="list only: judge sets from the catalog, read no headers",
    )
    p.add_argument("--limit", type=int, default=20, metavar="N", help="repositories (20)")
    p.add_argument("--json", action="store_true", help="print the sets and verdicts as JSON")
    p.set_defaults(handler=run)


def tty_progress(quiet: bool) -> tuple[Callable[[Progress], None], Callable[[], None]]:
    """A one-line progress report on a terminal's stderr, and what clears it."""
    tty = sys.stderr.isatty() and not quiet

    def show(p: Progress) -> None:
        if tty:
            count = f" {p.done}/{p.total}" if p.total else ""
            control(sys.stderr, "\r\033[K")
            sys.stderr.write(f"{p.stage}{count} {p.detail[-60:]}")
            sys.stderr.flush()

    def clear() -> None:
        if tty:
            control(sys.stderr, "\r\033[K")
            sys.stderr.flush()

    return show, clear


def run(args: argparse.Namespace, services: Services) -> int:
    show, clear = tty_progress(args.json)
    try:
        result = search_hub(
            services,
            SearchRequest(
                query=args.query,
                base_model=args.base_model,
                hardware_file=args.hardware,
                read_headers=not args.no_headers,
                limit=args.limit,
            ),
            progress=show,
        )
    finally:
        clear()
    if args.json:
        print(json.dumps(to_json(result), indent=2))
    else:
        print(render(result))
    for line in result.errors:
        print(f"warning: {shown(line, 1000)}", file=sys.stderr)
    return 0


def _row_json(r: SetRow) -> dict[str, Any]:
    return {
        "repo": r.repo,
        "revision": r.revision,
        "set": r.remote.name,
        "include": r.remote.include,
        "parts": r.remote.count,
        "missing_parts": list(r.remote.missing),
        "bytes": r.remote.total_bytes,
        "tier": r.tier.id if r.tier else None,
        "basis": r.basis,
        "verdict": r.kind or None,
        "verdict_text": r.verdict,
        "n_cpu_moe": r.n_cpu_moe,
        "speed": r.speed or None,
        "problem": r.problem or None,
        "suspicious": list(r.suspicious),
        "header_bytes_read": r.header_bytes,
        "projectors": list(r.projectors),
        "quality": [f"{q.metric} {q.value}" for q in r.tier.quality] if r.tier else [],
        "caveats": list(r.tier.caveats) if r.tier else [],
        "engines": list(r.tier.engines) if r.tier else [],
        "vision_engine": (r.tier.vision_engine or None) if r.tier else None,
    }


def to_json(result: SearchResult) -> dict[str, Any]:
    data: dict[str, Any] = {
        "endpoint": result.endpoint,
        "query": result.query,
        "judged": result.subject.to_dict(),
        "offline": result.offline,
        "status": result.status,
        "sets": [_row_json(r) for r in result.rows],
        "errors": list(result.errors),
    }
    if result.offline:
        data["catalog"] = [
            {"tier": r.tier.id, "repo": r.tier.repo, "basis": "catalog", "verdict": r.kind,
             "verdict_text": r.label, "n_cpu_moe": r.n_cpu_moe}
            for r in result.catalog.rows
        ]  # fmt: skip
    return data


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def render(result: SearchResult) -> str:
    machine = result.subject.describe()
    if result.offline:
        rows: list[tuple[str, ...]] = [("tier", "repository", "size", "fit (catalog estimate)")]
        for t in result.catalog.rows:
            rows.append((t.tier.id, t.tier.repo, size_text(t.tier.size_bytes), t.label))
        return "\n".join(
            [f"Catalog only (offline): {shown(result.offline_reason, 1000)}",
             f"Judged for {machine}.", "",
             *_table(rows)]
        )  # fmt: skip
    if not result.rows:
        return f"No Kimi-K3 GGUF set found for '{shown(result.query)}' on {result.endpoint}."
    rows = [("repository", "set", "parts", "size", "tier", "fit", "from")]
    for r in result.rows:
        fit = r.verdict
        if r.kind == "hybrid" and r.n_cpu_moe:
            fit += f" (--n-cpu-moe {r.n_cpu_moe})"
        if r.speed:
            fit += f", ~{r.speed}"
        rows.append(
            (
                f"{shown(r.repo)}@{shown(r.revision[:7])}",
                shown(r.remote.name),
                str(r.remote.count),
                size_text(r.remote.total_bytes),
                r.tier.id if r.tier else "-",
                fit,
                r.basis_text(),
            )
        )
    lines = [f"{result.status}; judged for {machine}.", "", *_table(rows)]
    notes = [
        f"  {shown(r.repo)} {shown(r.remote.name)}: {shown(r.problem, 600)}"
        for r in result.rows
        if r.problem
    ]
    if notes:
        lines += ["", "Not judged from headers:", *notes]
    read = sum(r.header_bytes for r in result.rows)
    lines += [
        "",
        f"Headers read this time: {size_text(read)}. Plan one set in full with "
        "`k3desk plan --remote REPO@REV --include PATTERN`.",
    ]
    return "\n".join(lines)
