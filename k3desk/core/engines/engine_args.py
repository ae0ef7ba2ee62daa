"""llama-server's arguments compared: a re-plan's changes, said in words (they are built
and edited in :mod:`k3desk.core.planning.argv`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from k3desk.core.planning.argv import bump_n_cpu_moe as bump_n_cpu_moe


def redact(argv: Sequence[str], secret: str) -> tuple[str, ...]:
    return tuple("***" if a == secret else a for a in argv)


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
