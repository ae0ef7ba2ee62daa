"""What the engine code tells a person reads as one clear sentence, and every command it
suggests (`k3desk ...`) exists with the options it names."""

from __future__ import annotations

import argparse
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from k3desk.cli import build_parser
from k3desk.core.engines import crash, install, launch
from k3desk.core.engines.crash import classify_exit, load_timeout
from k3desk.core.engines.probe import FLAGS, ProbeResult, probe_engine
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.paths import default_paths

COMMAND = re.compile(r"`(k3desk [^`]*)`")


@pytest.fixture
def h200(hardware_file: Callable[[str], Path]) -> HardwareProfile:
    return HardwareProfile.from_json_file(hardware_file("1xH200-141GB"))


def probe(**kw: object) -> ProbeResult:
    base: dict[str, object] = {
        "path": "/opt/llama/llama-server",
        "size": 1,
        "mtime_ns": 1,
        "runs": True,
        "loads_k3": True,
        "flags": dict.fromkeys(FLAGS, True),
        "backends": ("CPU",),
    }
    return ProbeResult(**{**base, **kw})  # type: ignore[arg-type]


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_command(text: str) -> None:
    """``k3desk engine install --cpu``: each word a sub-command or an option it takes."""
    words = text.split()[1:]
    parser = build_parser()
    for word in words:
        subs = _subparsers(parser)
        if word in subs:
            parser = subs[word]
        elif word.startswith("-"):
            flag = word.split("=", 1)[0]
            assert flag in parser._option_string_actions, f"`{text}`: no option {flag}"
        elif subs:
            pytest.fail(f"`{text}`: {word!r} is not a sub-command")


def test_every_command_the_engine_messages_suggest_exists(h200: HardwareProfile) -> None:
    texts: list[str] = []
    for rule in crash._RULES:
        texts += [rule.summary, rule.fix]
    for rc in (-int(signal.SIGILL), -int(signal.SIGKILL), -int(signal.SIGABRT), 1):
        report = classify_exit(rc, ["error: x"])
        texts += [report.summary, report.fix]
    t = load_timeout(60, [])
    texts += [t.summary, t.fix]
    results = [
        probe(runs=False, run_problem="it cannot be executed (Exec format error)"),
        probe(loads_k3=False, k3_problem="it predates kimi-k3 support"),
        probe(flags={}),
        probe(cuda_archs=("89",), backends=("CUDA", "CPU")),
        probe(),
    ]
    for r in results:
        texts += [r.verdict(h200), *r.problems(h200)]
        texts += [launch._advice(r, vision) for vision in (False, True)]
    texts += [launch.INSTALL_HINT, launch.IMAGES_HINT]
    texts += [m for m in vars(install).values() if isinstance(m, str)]
    texts += install.choose_build(h200, None, None, machine="x86_64").notes
    commands = [c for text in texts for c in COMMAND.findall(text)]
    assert len(commands) > 10
    for command in commands:
        check_command(command)


def test_a_cpu_engine_on_a_gpu_machine_says_so_in_plain_words(
    fake_engine: Callable[..., Path], h200: HardwareProfile
) -> None:
    r = probe_engine(fake_engine("serve"), default_paths())
    assert r.usable
    assert r.gpu_problems(h200) == [
        "it has no CUDA support, so the GPUs (NVIDIA H200) would go unused; build a CUDA "
        "engine for them with `k3desk engine install` (it needs the CUDA toolkit)"
    ]
    assert r.verdict(h200) == f"This engine loads Kimi-K3, but {r.gpu_problems(h200)[0]}."


def test_a_cuda_build_for_another_gpu_names_both_architectures(h200: HardwareProfile) -> None:
    r = probe(cuda_archs=("89",), backends=("CUDA", "CPU"))
    assert r.gpu_problems(h200) == [
        "it was compiled for CUDA architecture sm_89, which cannot run on GPU 0 "
        "(NVIDIA H200, sm_90); build one for sm_90 with `k3desk engine install`"
    ]
    two = probe(cuda_archs=("89", "120"), backends=("CUDA", "CPU"))
    assert "for CUDA architectures sm_89, sm_120, which" in two.gpu_problems(h200)[0]


def test_an_engine_without_api_key_is_not_called_fine() -> None:
    r = probe(flags={**dict.fromkeys(FLAGS, True), "--api-key": False})
    assert not r.usable
    assert r.reason() == "lacks --api-key, so it would answer anyone without a key"
    assert r.verdict() == (
        "This engine lacks --api-key, so it would answer anyone without a key. "
        "`k3desk engine install` builds a newer one."
    )


def test_a_crash_summary_inside_a_probe_verdict_reads_as_one_sentence() -> None:
    r = probe(loads_k3=False, k3_problem="The engine stopped unexpectedly: error: no memory.")
    assert r.verdict() == (
        "This engine cannot load Kimi-K3: the engine stopped unexpectedly: error: no memory. "
        "`k3desk engine install` builds one that can."
    )
