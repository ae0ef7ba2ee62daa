"""Calibration from this machine's own runs: kept, applied, and only where it belongs."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.tuning.calibration import (
    CalibrationStore,
    SpeedTracker,
    calibrate_plan,
    correction_from,
)
from k3desk.core.tuning.identity import machine_key
from k3desk.core.tuning.metrics import MeasuredSpeed


def tracker(hw: HardwareProfile, layout: ModelLayout, store: CalibrationStore) -> SpeedTracker:
    plan = make_plan(hw, layout, PlanOptions(ctx=512))
    return SpeedTracker(hw, layout, plan, store, clock=lambda: 1_700_000_000.0)


def test_a_measured_answer_is_kept_privately_and_shown_with_later_plans(
    tmp_path: Path, here: HardwareProfile, layout: ModelLayout
) -> None:
    store = CalibrationStore(tmp_path / "state")
    t = tracker(here, layout, store)
    predicted = t.plan.speed.expected_tps
    c = t.record(MeasuredSpeed(prompt_tps=400.0, decode_tps=predicted / 2, prompt_tokens=120,
                               decode_tokens=64))  # fmt: skip
    text = c.text()
    assert text.startswith("measured: prompt 400 tok/s (120 tokens")
    assert "decode" in text
    assert "off" in text
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    later = calibrate_plan(store, here, layout, make_plan(here, layout, PlanOptions(ctx=512)))
    s = later.speed
    assert s.calibration.startswith("measured here: ")
    assert f"{predicted / 2:.3g} tok/s decode" in s.calibration
    assert "400 tok/s prompt" in s.calibration
    # the comparison was made at the answer's own depth, so the ratio is of like with like
    assert s.calibrated_tps == pytest.approx(
        s.expected_tps * (predicted / 2) / c.predicted_decode, rel=1e-6
    )


def test_other_machines_and_hardware_files_neither_use_nor_write_it(
    tmp_path: Path,
    here: HardwareProfile,
    layout: ModelLayout,
    hardware_file: Callable[[str], Path],
) -> None:
    store = CalibrationStore(tmp_path / "state")
    tracker(here, layout, store).record(MeasuredSpeed(50.0, 10.0, 100, 50))
    other = replace(here, hostname="another-desk")
    assert machine_key(other) != machine_key(here)
    assert not store.correction(other, layout, "cpu").known
    # a plan for a hardware file is for a machine that never ran anything here
    epyc = HardwareProfile.from_json_file(hardware_file("epyc9554p-1.5TB-cpu"))
    assert not store.correction(epyc, layout, "cpu").known
    tracker(epyc, layout, store).record(MeasuredSpeed(50.0, 10.0, 100, 50))
    assert len(store.records()) == 1


def test_a_model_not_run_here_gets_the_machines_correction(tmp_path: Path) -> None:
    from k3desk.core.tuning.calibration import SpeedRecord

    def rec(model: str, kind: str, measured: float, predicted: float) -> SpeedRecord:
        return SpeedRecord(1.0, "m", model, model, kind, 2, predicted, 0.0, measured, 0.0, 64, 0)

    records = [rec("a", "cpu", 8.0, 10.0), rec("a", "cpu", 9.0, 10.0), rec("b", "cpu", 3.0, 4.0),
               rec("c", "gpu", 40.0, 20.0)]  # fmt: skip
    c = correction_from(records, "new", "cpu")
    assert c.model_runs == 0
    assert c.runs == 3
    assert c.decode_factor == pytest.approx(0.8)  # the median of 0.8, 0.9, 0.75
    own = correction_from(records, "a", "cpu")
    assert own.model_runs == 2
    assert own.decode_factor == pytest.approx(0.85)
    assert own.measured_decode == pytest.approx(8.5)
    assert not correction_from(records, "new", "hybrid").known


def test_a_damaged_file_is_set_aside_not_lost(
    tmp_path: Path, here: HardwareProfile, layout: ModelLayout
) -> None:
    store = CalibrationStore(tmp_path / "state")
    store.path.parent.mkdir(parents=True)
    store.path.write_text('{"schema": 1, "records": [{"when": "yesterday"}]}', encoding="utf-8")
    assert store.records() == []
    assert "damaged" in store.note
    kept = list(store.path.parent.glob("speed-measured.json.damaged-*"))
    assert len(kept) == 1
    assert "yesterday" in kept[0].read_text(encoding="utf-8")
    tracker(here, layout, store).record(MeasuredSpeed(50.0, 10.0, 100, 50))
    assert len(store.records()) == 1
    # a record with a speed that is not one is refused before it is written
    data = json.loads(store.path.read_text(encoding="utf-8"))
    data["records"][0]["measured_decode"] = -3
    store.path.write_text(json.dumps(data), encoding="utf-8")
    assert store.records() == []


def test_only_the_last_records_are_kept(
    tmp_path: Path, here: HardwareProfile, layout: ModelLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    from k3desk.core.tuning import calibration

    monkeypatch.setattr(calibration, "MAX_RECORDS", 5)
    store = CalibrationStore(tmp_path / "state")
    t = tracker(here, layout, store)
    for i in range(8):
        t.record(MeasuredSpeed(50.0, 10.0 + i, 100, 50))
    kept = store.records()
    assert [r.measured_decode for r in kept] == [13.0, 14.0, 15.0, 16.0, 17.0]


def test_the_file_is_read_once_per_change_and_a_new_run_is_seen(
    tmp_path: Path, here: HardwareProfile, layout: ModelLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table judging many tiers asks for corrections many times: one read of the file,
    until a run is added (by this store or another process), which is then seen."""
    store = CalibrationStore(tmp_path / "state")
    tracker(here, layout, store).record(MeasuredSpeed(50.0, 10.0, 100, 50))
    reads = 0
    real = CalibrationStore._read

    def counting(self: CalibrationStore) -> list:  # type: ignore[type-arg]
        nonlocal reads
        reads += 1
        return real(self)

    monkeypatch.setattr(CalibrationStore, "_read", counting)
    for _ in range(10):
        assert store.correction(here, layout, "cpu").runs == 1
    assert reads == 1
    CalibrationStore(tmp_path / "state").add(store.records()[0])  # another writer
    assert store.correction(here, layout, "cpu").runs == 2
    assert reads == 3  # the other writer's read, and this store's after the change
