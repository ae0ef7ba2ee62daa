"""llama-server's router mode: every model a person has, loaded when a request names it.

Started without a model and with ``--models-preset FILE``, llama-server b11434 is a
router (tools/server/README.md, "Using multiple models"): it lists the file's models at
``/v1/models`` with their state (unloaded, loading, loaded), starts a child llama-server
with a model's own arguments when a request names it (the ``model`` field of a POST; it
waits while the child loads), and forwards the request.  ``--models-max 1`` keeps one
model loaded: starting another unloads the first, which is what a Kimi-K3 set needs (two
never fit one machine).  The router owns host, port, key and alias: it drops them from a
model's arguments and gives each child a loopback port of its own.

The preset file is llama.cpp's INI (common/preset.cpp): a ``[name]`` section per model,
``key = value`` per argument, where the key is the argument without its dashes (long or
short) and a flag is ``key = true``; ``no-repack = true`` is read as ``--no-repack``
(``parse_bool_arg`` turns a negated key around).  A value ends at a new line or at any
``;`` or ``#`` (its ``eol-start`` rule is optional white space, then one of them: a
comment starts there even inside a path), and white space at either end is lost: an
argument that cannot be written that way is refused here, never written cut (a path with
such characters is served by ``k3desk serve``, which passes it as an argument).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from k3desk.core.errors import EngineError

# router options (common/arg.cpp): only these models, one loaded at a time
MODELS_PRESET = "--models-preset"
MODELS_MAX = "--models-max"
# [name]: the section header grammar takes anything but "]" (common/preset.cpp); a ":" in
# it is rewritten as a Hub tag (canonical_tag), so names keep to what survives unchanged
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
# a value the INI grammar reads back whole: no new line, no comment character anywhere,
# no white space at either end
_CUT = re.compile(r"[\r\n;#]|^\s|\s$")
# an argument name, as opposed to a value such as "-1"
_OPTION = re.compile(r"--?[A-Za-z][\w-]*")
# arguments a router sets for each child itself (README: "controlled by router")
_ROUTER_OWNED = frozenset({"--host", "--port", "--api-key", "--api-key-file", "--alias", "-a"})
# arguments given more than once that llama.cpp reads as one comma-separated list
_LISTS = frozenset({"-ot", "--override-tensor"})


class RouterError(EngineError):
    """A model's launch cannot be written into llama-server's preset file."""


@dataclass(frozen=True)
class PresetModel:
    """One model the router may load: the name requests give and its launch arguments
    (llama-server's, after the executable, as a plan makes them)."""

    name: str
    args: tuple[str, ...]


def preset_name(stem: str) -> str:
    """A request's ``model`` for a set named ``stem`` (its part 1's name without the
    split suffix): the characters the preset file keeps as they are, the rest as "-"."""
    name = re.sub(r"[^A-Za-z0-9_.\-]", "-", stem).lstrip(".-") or "model"
    return name[:128]


def preset_options(args: Sequence[str]) -> list[tuple[str, str]]:
    """``args`` as the preset file's ``key = value`` pairs, in order (a flag is ``true``;
    a list option given twice is joined with ",", as llama.cpp splits it)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and "=" in arg:  # --key=value
            arg, inline = arg.split("=", 1)
            args = [*args[:i], arg, inline, *args[i + 1 :]]
        if not _OPTION.fullmatch(arg):
            raise RouterError(f"{arg!r} in a launch's arguments follows no option.")
        has_value = i + 1 < len(args) and not _OPTION.fullmatch(args[i + 1])
        value = args[i + 1] if has_value else "true"
        i += 2 if has_value else 1
        if arg in _ROUTER_OWNED:
            continue
        if _CUT.search(value):
            raise RouterError(
                f"The value of {arg} ({value!r}) cannot be written in llama-server's preset "
                "file: it holds a new line, a ';' or a '#', or spaces at an end."
            )
        key = arg.lstrip("-")
        if key in out and arg in _LISTS:
            value = f"{out[key]},{value}"
        out[key] = value
    return list(out.items())


def preset_text(models: Sequence[PresetModel]) -> str:
    """The preset file for ``models`` (each name once)."""
    lines = ["version = 1", ""]
    seen: set[str] = set()
    for m in models:
        if not _NAME.fullmatch(m.name) or m.name in seen:
            raise RouterError(f"{m.name!r} cannot name a model in llama-server's preset file.")
        seen.add(m.name)
        lines.append(f"[{m.name}]")
        lines += [f"{key} = {value}" for key, value in preset_options(m.args)]
        lines.append("")
    return "\n".join(lines)


def router_args(preset: str, *, loaded_at_once: int = 1) -> tuple[str, ...]:
    """llama-server's arguments for a router over the models in the file ``preset``."""
    return (MODELS_PRESET, preset, MODELS_MAX, str(loaded_at_once))
