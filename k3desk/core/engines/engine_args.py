"""llama-server's arguments edited and compared: a re-plan's changes, said in words."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence


def redact(argv: Sequence[str], secret: str) -> tuple[str, ...]:
    return tuple("***" if a == secret else a for a in argv)


_CPU_MOE = ("--n-cpu-moe", "-ncmoe")


def bump_n_cpu_moe(
    args: Sequence[str], n_layers: int = 0, step: int = 0
) -> tuple[tuple[str, ...], str] | None:
    """Keep more expert layers in RAM: raise ``--n-cpu-moe`` by ``step`` (default about a
    tenth of the layers, at least 1; 4 when the layer count is unknown).  ``--n-cpu-moe N``
    covers layers 0..N-1, so N = ``n_layers`` puts every expert in RAM; None then."""
    out = list(args)
    if "--cpu-moe" in out or "-cmoe" in out:
        return None
    if step <= 0:
        step = max(1, math.ceil(n_layers / 10)) if n_layers else 4
    current, index = 0, -1
    for i, a in enumerate(out):
        if a in _CPU_MOE and i + 1 < len(out):
            current, index = int(out[i + 1]), i + 1
        elif a.startswith("--n-cpu-moe="):
            current, index = int(a.split("=", 1)[1]), i
            out[i] = "--n-cpu-moe"
            out.insert(i + 1, str(current))
            index = i + 1
    limit = n_layers or None
    if limit is not None and current >= limit:
        return None
    new = current + step if limit is None else min(limit, current + step)
    if index >= 0:
        out[index] = str(new)
    else:
        out += ["--n-cpu-moe", str(new)]
    return (
        tuple(out),
        f"re-planned after GPU out-of-memory: --n-cpu-moe {current} -> {new} "
        f"(expert weights of {new - current} more layer{'s' if new - current > 1 else ''} "
        "kept in RAM)",
    )


_NUMBER = re.compile(r"-\d")


def _options(args: Sequence[str]) -> dict[str, str | None]:
    """``-c 4096 -fa on --jinja`` -> {"-c": "4096", "-fa": "on", "--jinja": None}."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-") or _NUMBER.match(a):
            out[f"argument {i + 1}"] = a  # a stray positional
            i += 1
        elif a.startswith("--") and "=" in a:
            key, value = a.split("=", 1)
            out[key] = value
            i += 1
        elif i + 1 < len(args) and (
            not args[i + 1].startswith("-") or _NUMBER.match(args[i + 1]) is not None
        ):
            out[a] = args[i + 1]
            i += 2
        else:
            out[a] = None
            i += 1
    return out


def arg_changes(old: Sequence[str], new: Sequence[str]) -> list[str]:
    """How ``new`` llama-server arguments differ from ``old``, one item per option:
    ``["--n-cpu-moe 2 -> 4", "added --no-mmproj-offload"]``."""
    a, b = _options(old), _options(new)

    def said(key: str, value: str | None) -> str:
        return key if value is None else f"{key} {value}"

    out: list[str] = []
    for key, value in b.items():
        if key not in a:
            out.append(f"added {said(key, value)}")
        elif a[key] != value:
            out.append(f"{key} {a[key] or 'on'} -> {value or 'on'}")
    out += [f"removed {said(key, value)}" for key, value in a.items() if key not in b]
    return out


def describe_changes(
    old_args: Sequence[str], old_port: int, new_args: Sequence[str], new_port: int
) -> str:
    """What differs between two launches, in words ("" when nothing does)."""
    out = arg_changes(old_args, new_args)
    if new_port != old_port:
        out.append(f"port {old_port} -> {new_port}")
    return ", ".join(out)
