"""One figure per machine: the wizard's judgement of this machine, ``k3desk tiers`` and
``k3desk models list`` (each a run of its own, as a person starts them) predict the same
speed for the same tier, because the RAM bandwidth is measured once and kept."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import k3desk.cli
import k3desk.core.hardware.detect as detect
from k3desk.app import Services

TIER = "vcruz305-ud-iq1s"


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc = k3desk.cli.main(list(args), Services())  # a fresh run, as a new process would be
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def _speed(line: str) -> str:
    found = re.search(r"~([0-9.,]+) tok/s", line)
    assert found is not None, line
    return found.group(1)


def test_wizard_tiers_and_models_list_give_a_tier_one_speed(  # type: ignore[no-untyped-def]
    ctx, qtbot, capsys, monkeypatch, twin_factory: Callable[[str], list[Path]]
) -> None:
    # free RAM moves as other programs run; what is asked here is the bandwidth's figure
    memory = detect.detect_memory(detect.REAL_ROOT)
    monkeypatch.setattr(detect, "detect_memory", lambda *_a, **_k: memory)
    shard = twin_factory(TIER)[0]
    _cli(capsys, "models", "add", str(shard))

    hardware: Any = ctx.hardware  # what the wizard's machine and tiers steps show
    hardware.detect()
    qtbot.waitUntil(lambda: hardware.judgement is not None, timeout=120_000)
    row = hardware.judgement.row(TIER)
    assert row is not None
    assert row.speed is not None
    wizard = row.speed.text().split()[0]

    tiers = _cli(capsys, "tiers")
    (line,) = [x for x in tiers.splitlines() if x.split()[1:2] == [TIER]]
    models = _cli(capsys, "models", "list")
    (model_line,) = [x for x in models.splitlines() if "Kimi-K3-UD-IQ1_S:" in x]
    assert (wizard, _speed(line), _speed(model_line)) == (wizard, wizard, wizard)
