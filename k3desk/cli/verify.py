"""``k3desk verify``: re-check a downloaded tier (hashes, or GGUF structure when none are known)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.cli import control
from k3desk.core.app.values import Progress, fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.services import Services


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="re-check a downloaded tier's files against the Hub's hashes",
        description="Re-hash every file of a download against the SHA-256 the Hub published "
        "(saved by `k3desk download`), or against the folder's manifest.json; with neither, "
        "check the GGUF structure of the shard set. Exit status 1 if anything is wrong.",
    )
    p.add_argument("path", type=Path, metavar="DIR_OR_SHARD")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, services: Services) -> int:
    from k3desk.core.app.downloads import verify_target

    tty = sys.stderr.isatty() and not args.json

    def progress(p: Progress) -> None:
        if tty and p.total:
            control(sys.stderr, "\r\033[K")
            sys.stderr.write(
                f"{p.stage}: {fmt_bytes(p.done)}/{fmt_bytes(p.total)} {p.detail[-50:]}"
            )
            sys.stderr.flush()

    report = verify_target(args.path, progress=progress, tiers=services.catalog_tiers())
    if tty:
        control(sys.stderr, "\r\033[K")
    if args.json:
        data = dataclasses.asdict(report)
        data["ok"] = report.ok
        print(json.dumps(data, indent=1))
        return 0 if report.ok else 1
    how = {
        "state": "against the hashes the Hub published (k3desk download record)",
        "manifest": "against the folder's manifest.json",
        "gguf": "by GGUF structure only",
    }[report.method]
    print(f"Checked {len(report.files)} files in {report.folder} {how}.")
    for note in report.notes:
        print(f"note: {note}")
    for f in report.bad:
        detail = {
            "missing": "missing",
            "wrong-size": f"wrong size ({f.actual}, expected {f.expected})",
            "mismatch": f"content differs (sha {f.actual[:16]}…, expected {f.expected[:16]}…)",
            "refused": f"not checked: {f.actual}",
        }.get(f.status, f.status)
        print(f"  BAD  {f.path}: {detail}")
    if report.ok:
        print("All files are intact.")
        return 0
    redo = f"k3desk download --repo {report.repo} ..." if report.repo else "k3desk download"
    print(
        f"{len(report.bad)} file(s) are damaged or missing. Run the same `{redo}` again: "
        "only these files will be fetched."
    )
    return 1
