"""The tier judgement every shell renders, against the planner's own plans."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest

from k3desk.core.app.services import Services
from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import TierRequest, judge_tiers
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.tuning.calibration import CalibrationStore, SpeedRecord
from k3desk.core.tuning.identity import machine_key
from k3desk.core.units import fmt_tps
from tests.fixtures.hardware import HARDWARE_DIR


@pytest.mark.parametrize("name", ["8xH100-2TB", "3xGB10-node", "no-gpu-laptop-32GB"])
def test_rows_read_the_plans_and_never_derive_their_own_figures(name: str) -> None:
    services = Services()
    path = HARDWARE_DIR / f"{name}.json"
    hw = services.load_hardware(path)
    judged = judge_tiers(TierRequest(hw, Subject.hardware_file(path, hw)), services.catalog)
    assert judged.subject.describe() == f"the machine in {path.name} ({hw.label})"
    assert [r.tier.id for r in judged.rows] == [v.tier.id for v in judged.recommendation.verdicts]
    chosen = judged.recommendation.best or judged.recommendation.closest
    assert [r.tier.id for r in judged.rows if r.recommended] == [chosen.tier.id]
    for row in judged.rows:
        plan = row.plan
        assert plan is not None, row.tier.id
        ram_dev = next(d for d in plan.devices if d.device == "RAM")
        ram = row.need("RAM")
        assert ram is not None
        # the RAM bar misses exactly what the planner says is missing
        assert ram.short == plan.shortfall == row.shortfall
        assert ram.need - ram.have == ram_dev.used - ram_dev.capacity
        # --n-cpu-moe N keeps layers 0..N-1 in RAM; layer 0 is dense
        args = list(plan.server_args)
        if "--n-cpu-moe" in args:
            n = int(args[args.index("--n-cpu-moe") + 1])
            moe_below = sum(1 for p in plan.layers if p.ffn == "moe" and p.index < n)
            assert row.expert_layers_on_cpu == moe_below == n - 1, row.tier.id
        # a speed only for a tier that runs (from memory, or streaming from disk)
        assert (row.speed is None) == (row.kind in ("no-fit", "n/a")), row.tier.id
        disk = row.need("Disk")
        assert disk is not None
        assert (disk.need, disk.have) == (row.tier.size_bytes, hw.disk.free)  # type: ignore[union-attr]


def test_unified_memory_shows_one_pool() -> None:
    """On a GB10 node the GPU's share is system RAM: one RAM bar, no VRAM bar."""
    services = Services()
    path = HARDWARE_DIR / "3xGB10-node.json"
    hw = services.load_hardware(path)
    judged = judge_tiers(TierRequest(hw, Subject.hardware_file(path, hw)), services.catalog)
    for row in judged.rows:
        assert row.need("VRAM") is None
        ram = row.need("RAM")
        assert ram is not None
        assert ram.have <= hw.memory.available


def _record(hw: HardwareProfile, label: str, predicted: float, measured: float) -> SpeedRecord:
    return SpeedRecord(
        when=1_700_000_000.0, machine=machine_key(hw), model=f"{label}|1|1",
        model_label=label, kind="cpu", threads=64, predicted_decode=predicted,
        predicted_prompt=0.0, measured_decode=measured, measured_prompt=0.0,
        decode_tokens=64, prompt_tokens=0,
    )  # fmt: skip


def test_the_tiers_show_this_machines_correction_beside_the_prediction(tmp_path: Path) -> None:
    """Runs measured here correct the tiers' speeds (shown beside the model's own
    figure): a tier run here by its own runs, the others by the machine's runs of the
    same kind of plan; a hardware file (another machine) gets no correction."""
    services = Services()
    path = HARDWARE_DIR / "epyc9554p-1.5TB-cpu.json"
    hw = replace(services.load_hardware(path), source="detected")
    tiers = services.catalog.tiers
    plain = judge_tiers(TierRequest(hw, Subject.this_machine(hw)), tiers)
    cpu_rows = [r for r in plain.rows if r.kind == "cpu" and r.speed is not None]
    assert len(cpu_rows) >= 2
    run_here, other = cpu_rows[0], cpu_rows[1]
    assert run_here.speed is not None
    assert other.speed is not None
    assert run_here.speed.here == 0
    assert "here" not in run_here.speed.text()

    store = CalibrationStore(tmp_path)
    store.add(_record(hw, "some-other-model.gguf", 10.0, 7.0))
    store.add(_record(hw, PurePosixPath(run_here.tier.first_shard).name, 10.0, 5.0))
    judged = judge_tiers(TierRequest(hw, Subject.this_machine(hw), state_dir=tmp_path), tiers)
    mine, theirs = judged.row(run_here.tier.id), judged.row(other.tier.id)
    assert mine is not None
    assert mine.speed is not None
    assert theirs is not None
    assert theirs.speed is not None
    assert mine.speed.expected == run_here.speed.expected  # the model's figure is kept
    assert mine.speed.here == pytest.approx(run_here.speed.expected * 0.5)
    assert mine.speed.calibration.startswith("measured here: 5 tok/s decode")
    # the other models' runs (0.7 and 0.5): their median
    assert theirs.speed.here == pytest.approx(other.speed.expected * 0.6)
    assert theirs.speed.text().endswith(f"(here ~{fmt_tps(other.speed.expected * 0.6)})")
    assert "other models" in theirs.speed.details()

    from_file = replace(hw, source="file")
    request = TierRequest(from_file, Subject.this_machine(hw), state_dir=tmp_path)
    judged = judge_tiers(request, tiers)
    assert all(r.speed is None or r.speed.here == 0 for r in judged.rows)
