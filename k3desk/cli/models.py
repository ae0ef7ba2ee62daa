"""``k3desk models add|list|remove``: the GGUF sets you already have ("My models")."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from k3desk.core.app.library import (
    ModelRow,
    ModelsJudgement,
    add_model,
    list_models,
    remove_model,
)
from k3desk.core.app.subject import judged_machine
from k3desk.core.app.values import fmt_bytes

if TYPE_CHECKING:
    from k3desk.core.app.services import Services


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "models",
        help="the GGUF models you already have: add, list, remove",
        description="Add a Kimi-K3 GGUF file (any part of a shard set) or a folder of them, "
        "list your models with their verdict for this machine, or take one off the list. "
        "Each set is checked from its headers, recognised as a catalog tier where it is one, "
        "and paired with the vision projector beside it. Sets in the model folders of "
        "Settings are listed too. Files are never moved or deleted.",
    )
    msub = p.add_subparsers(dest="models_command", metavar="ACTION")
    a = msub.add_parser("add", help="add a .gguf file or a folder")
    a.add_argument("path", type=Path, help="a .gguf file (any part of the set) or a folder")
    a.add_argument("--json", action="store_true", help="print what was added as JSON")
    a.set_defaults(handler=run_add)
    ls = msub.add_parser("list", help="list your models with their verdict")
    ls.add_argument(
        "--hardware",
        type=Path,
        metavar="FILE",
        help="judge them for the machine in FILE (`k3desk doctor --json` output)",
    )
    ls.add_argument("--ctx", type=int, default=8192, metavar="N", help="context size (8192)")
    ls.add_argument("--json", action="store_true", help="print the models as JSON")
    ls.set_defaults(handler=run_list)
    rm = msub.add_parser("remove", help="take a model off the list (the files stay)")
    rm.add_argument("key", metavar="PATH|ID", help="the path that was added, or the model's id")
    rm.add_argument("--json", action="store_true", help="print what was removed as JSON")
    rm.set_defaults(handler=run_remove)

    def usage(_args: argparse.Namespace, _services: Services) -> int:
        p.print_help()
        return 2

    p.set_defaults(handler=usage)


def run_add(args: argparse.Namespace, services: Services) -> int:
    result = add_model(services, args.path)
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(result.path),
                    "already": result.already,
                    "added": [m.to_dict() for m in result.added],
                    "skipped": [m.to_dict() for m in result.skipped],
                },
                indent=2,
            )
        )
        return 0
    verb = "Already in your models" if result.already else "Added"
    print(f"{verb}: {result.path}")
    for m in result.added:
        tier = f" (the catalog tier {m.tier.tier.id})" if m.tier is not None else ""
        vision = f"; projector {m.projector.name}" if m.projector is not None else ""
        print(f"  {m.id}  {m.name}{tier}: {m.parts} part(s), {fmt_bytes(m.size_bytes)}{vision}")
    for m in result.skipped:
        print(f"  skipped {m.shard}: {m.problem}")
    return 0


def run_list(args: argparse.Namespace, services: Services) -> int:
    hw, subject = judged_machine(services, args.hardware)
    judged = list_models(services, hw, subject, ctx=args.ctx)
    if args.json:
        print(json.dumps(to_json(judged), indent=2))
        return 0
    print(render(judged))
    return 0


def to_json(judged: ModelsJudgement) -> dict[str, object]:
    return {
        "judged": judged.subject.to_dict(),
        "models": [r.to_dict() for r in judged.rows],
        "problems": list(judged.problems),
    }


def _line(row: ModelRow) -> str:
    m = row.model
    speed = f", ~{row.speed.text()}" if row.speed is not None else ""
    vision = ", vision" if m.projector is not None else ""
    where = "" if m.source == "added" else f" [folder {m.origin}]"
    return (
        f"{m.id}  {m.name}: {row.label}{speed}\n"
        f"            {m.shard} ({m.parts} part(s), {fmt_bytes(m.size_bytes)}{vision}){where}"
    )


def render(judged: ModelsJudgement) -> str:
    lines = [f"Your models, judged for {judged.subject.describe()}:"]
    if not judged.rows:
        lines.append("  none yet: `k3desk models add PATH` adds a .gguf file or a folder.")
    lines += [_line(r) for r in judged.rows]
    lines += [f"Note: {p}" for p in judged.problems]
    return "\n".join(lines)


def run_remove(args: argparse.Namespace, services: Services) -> int:
    removed = remove_model(services, args.key)
    if args.json:
        print(json.dumps({"removed": str(removed)}))
        return 0
    print(f"Removed from your models: {removed} (the files stay where they are)")
    return 0
