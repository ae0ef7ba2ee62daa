"""The command-line shell over k3desk.core.

Each sub-command lives in its own module with ``register(subparsers)``; the
module's handler takes ``(args, services)`` and returns an exit status.  Errors
from core (:class:`K3Error`) are printed as their message and hint, never as
a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import math
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from k3desk import __version__
from k3desk.core.app.values import Cancelled, K3Error, visible

if TYPE_CHECKING:
    from k3desk.core.app.services import Services

# Sub-command modules, in the order `k3desk --help` lists them.
COMMAND_MODULES = (
    "k3desk.cli.doctor",
    "k3desk.cli.tiers",
    "k3desk.cli.search",
    "k3desk.cli.validate",
    "k3desk.cli.plan",
    "k3desk.cli.models",
    "k3desk.cli.download",
    "k3desk.cli.verify",
    "k3desk.cli.chat",
    "k3desk.cli.engine",
    "k3desk.cli.serve",
    "k3desk.cli.api",
    "k3desk.cli.tune",
    "k3desk.cli.desktop_entry",
    "k3desk.cli.cluster",
)


def _command_module(name: str) -> str:
    """The sub-command a module registers: its name, with '-' for '_'."""
    return name.rsplit(".", 1)[1].replace("_", "-")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; with ``command``, only that sub-command's module is imported.

    Importing every sub-command costs a quarter of a second (numpy, httpx, ...),
    which a scripted ``k3desk download`` or ``k3desk doctor --json`` should not pay.
    """
    parser = argparse.ArgumentParser(
        prog="k3desk",
        description="Pick, download, launch and chat with Kimi-K3. "
        "Run without arguments to open the desktop app.",
    )
    parser.add_argument("--version", action="version", version=f"k3desk {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = [m for m in COMMAND_MODULES if _command_module(m) == command] or COMMAND_MODULES
    for name in wanted:
        importlib.import_module(name).register(sub)
    return parser


def cluster_serve_alias(argv: list[str]) -> list[str]:
    """``serve --cluster NAME ...`` is ``cluster serve NAME ...`` (one implementation)."""
    if not argv or argv[0] != "serve":
        return argv
    rest = argv[1:]
    for i, a in enumerate(rest):
        if a.startswith("--cluster="):
            return ["cluster", "serve", a.split("=", 1)[1], *rest[:i], *rest[i + 1 :]]
        if a == "--cluster" and i + 1 < len(rest):
            return ["cluster", "serve", rest[i + 1], *rest[:i], *rest[i + 2 :]]
    return argv


# 128 + SIGPIPE: what a shell reports for `yes | head`'s `yes`
EXIT_BROKEN_PIPE = 141


def _tolerant_output() -> None:
    """Undecodable bytes of file names (lone surrogates, PEP 383) are printed as
    escapes instead of ending the command with UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError, io.UnsupportedOperation):
                reconfigure(errors="backslashreplace")


class VisibleText:
    """A text stream whose every write goes through :func:`visible`: whatever k3desk
    prints (a server's answer, a GGUF string, a file name, an error quoting either),
    escape and control sequences in it are shown, not acted on by the terminal.

    k3desk's own terminal control (a progress bar's ``\\r\\x1b[K``, dimmed reasoning)
    is written with :func:`control`, which passes it through as is.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @property
    def wrapped(self) -> TextIO:
        return self._stream

    def write(self, text: str) -> int:
        self._stream.write(visible(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def control(stream: TextIO, sequence: str) -> None:
    """Write k3desk's own terminal control ``sequence`` (never text from outside)."""
    raw = stream.wrapped if isinstance(stream, VisibleText) else stream
    raw.write(sequence)


@contextlib.contextmanager
def _visible_output() -> Iterator[None]:
    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, VisibleText):
        sys.stdout = VisibleText(sys.stdout)
    if not isinstance(sys.stderr, VisibleText):
        sys.stderr = VisibleText(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _reader_gone() -> int:
    """stdout's reader went away (`k3desk validate ... | head`): end quietly.

    stdout is pointed at /dev/null so that Python's final flush at exit does not
    fail a second time on the closed pipe.
    """
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_BROKEN_PIPE


def _say(*lines: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # stderr may be a closed pipe too
        for line in lines:
            print(line, file=sys.stderr)


def main(argv: Sequence[str], services: Services) -> int:
    _tolerant_output()
    with _visible_output():
        try:
            return _run(argv, services)
        except BrokenPipeError:
            return _reader_gone()


# Text options whose undecodable bytes are replaced, with a note, where they are used
# (a prompt and a system prompt are the person's words: they are sent, not refused).
TEXT_KEPT_WITH_NOTE = frozenset({("chat", "positional"), ("chat", "system")})
# Options that name a small JSON file k3desk reads whole (`k3desk doctor --json` output).
SMALL_FILE_OPTIONS = frozenset({"hardware"})
# The largest whole number any option takes (a byte count, a seed): beyond it is a typo.
INT_LIMIT = 2**63 - 1


def chosen_parsers(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> list[tuple[str, argparse.ArgumentParser]]:
    """The parser and the sub-command parsers ``args`` went through, each with its path
    ("cluster endpoint add")."""
    out = [("", parser)]
    path: list[str] = []
    current = parser
    while True:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if not subs or not isinstance(name, str) or name not in subs[0].choices:
            return out
        path.append(name)
        current = subs[0].choices[name]
        out.append((" ".join(path), current))


def argument_problem(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """What is wrong with a parsed value that argparse's own types let through ("" if
    nothing): a number that is not finite (``--temperature nan``), a whole number beyond
    any use, undecodable bytes in a text option (a model id, a URL, a stop string: they
    go into JSON and HTTP, which cannot carry them), a path that names a named pipe, a
    device or a socket (no option reads or writes one: ``--hardware /dev/zero`` would be
    read without end).  File and folder paths keep their bytes: the file system takes
    them as they are."""
    from k3desk.core.app.values import DEFAULT_LIMIT, has_undecodable, what_is

    for path, p in chosen_parsers(parser, args):
        command = path.split(" ", 1)[0] if path else ""
        for action in p._actions:
            if action.dest in (argparse.SUPPRESS, "help") or not hasattr(args, action.dest):
                continue
            value = getattr(args, action.dest)
            if value is None or value is action.default:
                continue
            name = "/".join(action.option_strings) or action.dest
            values = value if isinstance(value, list) else [value]
            for v in values:
                if isinstance(v, float) and not math.isfinite(v):
                    return f"argument {name}: {v!r} is not a number k3desk can use"
                if isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT_LIMIT:
                    return f"argument {name}: {v} is far beyond any value it takes"
                if isinstance(v, Path) and action.option_strings:
                    # (a model named as the command's positional is judged by the command,
                    # which says what it is: tests/hostile/test_not_files.py)
                    kind = what_is(v)
                    if kind.startswith(("a named pipe", "a device", "a socket")):
                        return f"argument {name}: {v} is {kind}, not a file or folder"
                    if action.dest in SMALL_FILE_OPTIONS and not kind:
                        size = v.stat().st_size
                        if size > DEFAULT_LIMIT:
                            return (
                                f"argument {name}: {v} holds {size:,} bytes; a file for "
                                f"{name} is at most {DEFAULT_LIMIT:,}"
                            )
                if (
                    isinstance(v, str)
                    and (command, action.dest) not in TEXT_KEPT_WITH_NOTE
                    and has_undecodable(v)
                ):
                    return f"argument {name}: {os.fsencode(v)!r:.80} has bytes that are not UTF-8"
    return ""


def _run(argv: Sequence[str], services: Services) -> int:
    argv = cluster_serve_alias(list(argv))
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
    args = parser.parse_args(argv)
    problem = argument_problem(parser, args)
    if problem:
        # exit 2, as for any other argument argparse refuses, with the sub-command's usage
        chosen_parsers(parser, args)[-1][1].error(problem)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args, services))
    except BrokenPipeError:
        return _reader_gone()
    except Cancelled:
        _say("Cancelled.")
        return 130
    except KeyboardInterrupt:
        _say("Interrupted.")
        return 130
    except K3Error as exc:
        _say(f"error: {exc.message}", *([f"  {exc.hint}"] if exc.hint else []))
        return 1
