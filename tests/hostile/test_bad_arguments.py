"""Every command-line option, given what a typo, a script or a hostile wrapper gives it:
``nan``, ``inf``, a whole number with 30 digits, bytes that are not UTF-8, ``/dev/zero``
and a named pipe.  Each is refused with argparse's own error (exit 2), by name.

The options are enumerated from the parser itself, so an option added later is covered
without being listed here."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from k3desk.cli import build_parser
from tests.hostile.conftest import bounded, no_traceback, run_k3desk

UNDECODABLE = os.fsdecode(b"abc\xff\xfe")  # what Python makes of such bytes in argv


@dataclass(frozen=True)
class Option:
    command: tuple[str, ...]  # ("cluster", "endpoint", "add")
    action: argparse.Action
    parser: argparse.ArgumentParser

    @property
    def name(self) -> str:
        return "/".join(self.action.option_strings) or self.action.dest

    def __str__(self) -> str:
        return f"{' '.join(self.command)} {self.name}"


def options() -> Iterator[Option]:
    def walk(parser: argparse.ArgumentParser, command: tuple[str, ...]) -> Iterator[Option]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*command, name))
            elif action.nargs != 0 and not action.choices and action.dest != "help":
                yield Option(command, action, parser)

    yield from walk(build_parser(), ())


ALL = list(options())


def argv_with(option: Option, value: str) -> list[str]:
    """The sub-command, its required positionals filled in, and ``option`` set to
    ``value``."""
    argv = list(option.command)
    for action in option.parser._actions:
        if action.nargs == 0 or isinstance(action, argparse._SubParsersAction):
            continue
        if action is option.action:
            flag = action.option_strings[-1:]
            argv += [f"{flag[0]}={value}"] if flag else [value]
        elif action.option_strings:
            if action.required:  # --node, --engine: given something valid
                first = next(iter(action.choices)) if action.choices else "x"
                argv += [action.option_strings[-1], str(first)]
        elif action.nargs != "?":  # a positional: a valid choice where it has them
            if action.choices:
                argv.append(str(next(iter(action.choices))))
            else:
                argv.append("x.gguf" if action.type is Path else "x")
    return argv


def bad_values(option: Option, fifo: Path) -> list[str]:
    kind = option.action.type
    if kind is float:
        return ["nan", "inf", "-inf", "1e400"]
    if kind is int:
        return ["9" * 30, "-" + "9" * 30]
    if kind is Path:
        return ["/dev/zero", str(fifo)]
    if kind is None:
        return [UNDECODABLE]
    return []  # a parsing function of its own (sizes): its errors are argparse's


def parse(argv: list[str]) -> tuple[int, str]:
    """What the CLI's parsing says about ``argv``: (exit status, message); (0, "") when
    it would run the command."""
    from k3desk.cli import argument_problem, chosen_parsers

    parser = build_parser(argv[0])
    messages: list[str] = []

    def error(self: argparse.ArgumentParser, message: str) -> None:
        messages.append(message)
        raise SystemExit(2)

    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    try:
        args = parser.parse_args(argv)
        problem = argument_problem(parser, args)
        if problem:
            chosen_parsers(parser, args)[-1][1].error(problem)
    except SystemExit as exc:
        return int(exc.code or 0), " ".join(messages)
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]
    return 0, ""


# prompts and system prompts are the person's own words: sent with the bytes replaced
# and a note (tests/hostile/test_text_and_pipes.py)
KEPT_WITH_A_NOTE = {("chat", "positional"), ("chat", "system")}


def test_every_option_is_enumerated() -> None:
    names = {str(o) for o in ALL}
    for expected in ("chat --temperature", "chat --stop", "chat --url", "tiers --hardware"):
        assert expected in names
    assert len(ALL) > 100


@pytest.mark.parametrize("option", ALL, ids=str)
def test_every_option_refuses_what_it_cannot_use(option: Option, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    if (option.command[0], option.action.dest) in KEPT_WITH_A_NOTE:
        pytest.skip("the person's own text: sent with a note (test_text_and_pipes.py)")
    values = bad_values(option, fifo)
    if not values:
        pytest.skip(f"{option.action.type} parses and refuses on its own")
    if option.action.type is Path and not option.action.option_strings:
        # the file a command is about: the command itself says what it is (exit 1)
        for value in values:
            r = run_k3desk(*argv_with(option, value), timeout=10)
            no_traceback(r.stderr)
            assert r.returncode in (1, 2), r.stderr.decode()
            assert f"{value} is " in r.stderr.decode(), r.stderr.decode()
        return
    for value in values:
        argv = argv_with(option, value)
        run = bounded(lambda argv=argv: parse(argv), 10)
        assert run.error is None, f"{argv}: {type(run.error).__name__}: {run.error}"
        status, message = run.value
        assert status == 2, f"{argv} was accepted"
        assert option.name.split("/")[-1] in message or option.action.dest in message, message


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["chat", "--url", "http://127.0.0.1:9", "--temperature", "nan", "hi"], "--temperature"),
        (["chat", "--url", "http://127.0.0.1:9", "--stop", b"\xff\xfe", "hi"], "--stop"),
        (["chat", "--url", "http://127.0.0.1:9", "--model", b"m\xff", "hi"], "--model"),
        (["chat", "--url", b"http://\xff.example", "hi"], "--url"),
        (["tiers", "--hardware", "/dev/zero"], "/dev/zero is a device"),
        (["download", "--repo", b"a/\xff", "--to", "x"], "--repo"),
        (["serve", "x.gguf", "--port", "9" * 30], "--port"),
    ],
    ids=["temperature-nan", "stop", "model", "url", "hardware-dev-zero", "repo", "port"],
)
def test_the_cli_names_the_argument_and_exits_2(argv: list[str | bytes], words: str) -> None:
    r = run_k3desk(*argv, timeout=30)
    no_traceback(r.stderr)
    assert r.returncode == 2, r.stderr.decode()
    assert words in r.stderr.decode("utf-8", "replace")


def test_a_huge_hardware_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "hw.json"
    with open(big, "wb") as f:
        f.truncate(170 * 1000 * 1000)
    r = run_k3desk("tiers", "--hardware", big, timeout=30)
    no_traceback(r.stderr)
    assert r.returncode == 2
    assert "holds 170,000,000 bytes" in r.stderr.decode()
