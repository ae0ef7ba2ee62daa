"""The tier judgement every shell renders, against the planner's own plans."""

from __future__ import annotations

import pytest

from k3desk.core.app.services import Services
from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import TierRequest, judge_tiers
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
