"""One RAM bandwidth per machine: measured the first time, kept in the state folder (0600),
used by every later run, measured again on request, and measured afresh when its record
is damaged."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from k3desk.core.app.services import Services
from k3desk.core.hardware.detect import detect_hardware
from k3desk.core.hardware.profile import Bandwidth
from k3desk.core.hardware.ram_rate import RECORD_FILE, RamBandwidthStore, kept_ram_bandwidth
from k3desk.core.tuning.identity import machine_key
from tests.conftest import REPO


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    """``k3desk doctor`` in a process of its own (nothing measured in this one carries)."""
    return subprocess.run(
        [sys.executable, "-m", "k3desk", "doctor", "--json", *args],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _bandwidth(run: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert run.returncode == 0, run.stderr
    bw: dict[str, object] = json.loads(run.stdout)["memory"]["bandwidth"]
    return bw


def _record(state: Path) -> dict[str, object]:
    data = json.loads((state / RECORD_FILE).read_text())
    (only,) = data["machines"]
    rec: dict[str, object] = only
    return rec


def test_the_figure_is_measured_once_and_kept_for_every_later_run() -> None:
    state = Services().paths.state
    first = _bandwidth(_doctor())
    assert first["source"] == "measured"
    record = state / RECORD_FILE
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    # a later run uses the kept figure to the byte, however the benchmark would read now
    again = _bandwidth(_doctor())
    assert again["bytes_per_s"] == first["bytes_per_s"] == _record(state)["bytes_per_s"]
    assert "measured here on" in str(again["note"])
    assert "k3desk doctor --remeasure" in str(again["note"])


def test_remeasure_replaces_the_kept_figure() -> None:
    services = Services()
    here = machine_key(detect_hardware(None, measure_bandwidth=False))
    RamBandwidthStore(services.paths.state).put(
        here, Bandwidth(1.25e9, "measured", "an old reading")
    )
    assert _bandwidth(_doctor())["bytes_per_s"] == 1.25e9  # kept, not measured
    new = _bandwidth(_doctor("--remeasure"))
    assert new["bytes_per_s"] != 1.25e9
    assert _record(services.paths.state)["bytes_per_s"] == new["bytes_per_s"]
    assert _bandwidth(_doctor())["bytes_per_s"] == new["bytes_per_s"]


def test_a_damaged_record_is_set_aside_and_the_figure_measured_afresh() -> None:
    state = Services().paths.state
    state.mkdir(parents=True, exist_ok=True)
    (state / RECORD_FILE).write_text('{"schema": 1, "machines": [{"machine": 7}]}')
    run = _doctor()
    bw = _bandwidth(run)
    assert "record of the RAM bandwidth" in run.stderr
    assert "was damaged" in run.stderr
    assert bw["source"] == "measured"
    assert _record(state)["bytes_per_s"] == bw["bytes_per_s"]
    assert any(p.name.startswith(f"{RECORD_FILE}.damaged-") for p in state.iterdir())


def test_kept_figures_are_per_machine_and_again_measures(tmp_path: Path) -> None:
    store = RamBandwidthStore(tmp_path)
    readings = iter([3e9, 5e9, 7e9])

    def measure() -> Bandwidth:
        return Bandwidth(next(readings), "measured", "a copy")

    first = kept_ram_bandwidth(store, "machine-a", measure)
    assert first is not None
    assert first.bytes_per_s == 3e9
    kept = kept_ram_bandwidth(store, "machine-a", measure)
    assert kept is not None
    assert kept.bytes_per_s == 3e9  # not measured again
    other = kept_ram_bandwidth(store, "machine-b", measure)
    assert other is not None
    assert other.bytes_per_s == 5e9  # another machine, its own
    again = kept_ram_bandwidth(store, "machine-a", measure, again=True)
    assert again is not None
    assert again.bytes_per_s == 7e9
    assert kept_ram_bandwidth(store, "machine-a", None) == again
    # nothing kept and nothing to measure with: the caller estimates
    assert kept_ram_bandwidth(store, "machine-c", None) is None
