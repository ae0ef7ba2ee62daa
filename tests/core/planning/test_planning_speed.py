"""Decode speed predictions against the llama.cpp speeds the seed cards publish."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.profile import Bandwidth, HardwareProfile
from k3desk.core.planning.model import PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.units import MiB

Machine = Callable[[str], HardwareProfile]
Layout = Callable[[str], ModelLayout]
BENCH = Path(__file__).resolve().parents[3] / "bench" / "predict_speed.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("predict_speed_bench", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_published_speed_is_below_its_bound_and_within_2x(bench: ModuleType) -> None:
    # nothing is fitted to the cards (their setups are partly assumed): they are a second
    # check, and a model off by more than 2x on any of them would be wrong in its physics
    rows = bench.build_rows()
    assert len(rows) == 6
    for row in rows:
        expected, low, high, bound = bench.predict(row)
        card = row.case.card_tps
        assert card < bound, row.case.name
        assert 0.5 < expected / card < 2.0, (row.case.name, expected, card)
        assert low <= expected <= high <= bound


def test_vcruz_tier_plans_as_resident_as_measured(machine: Machine, twin_layout: Layout) -> None:
    # the card: 316,036 MiB of weights resident on 8x A100-80GB, 10.8 tok/s
    plan = make_plan(machine("8xA100-80GB"), twin_layout("vcruz305-ud-iq1s"), PlanOptions())
    assert plan.verdict == "gpu"
    on_gpus = sum(d.weights for d in plan.devices if d.device != "RAM")
    assert on_gpus / MiB == pytest.approx(316_036, rel=0.03)


def test_faster_ram_helps_a_cpu_plan_but_never_beyond_the_bound(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("epyc9554p-1.5TB-cpu")
    layout = estimated("atomicchat-iq1s")
    base = make_plan(hw, layout, PlanOptions()).speed
    bw = hw.memory.bandwidth.bytes_per_s
    faster = replace(hw, memory=replace(hw.memory, bandwidth=Bandwidth(2 * bw, "override")))
    fast = make_plan(faster, layout, PlanOptions()).speed
    assert base.expected_tps < fast.expected_tps < 2 * base.expected_tps
    assert fast.upper_bound_tps == pytest.approx(2 * base.upper_bound_tps)
    for s in (base, fast):
        assert s.expected_tps <= s.upper_bound_tps
        assert s.bytes_per_token["RAM"] > 40e9  # every non-expert weight, each token


def test_streaming_from_disk_is_much_slower_and_says_so(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("epyc9554p-1.5TB-cpu")
    layout = estimated("grearl-iq1s")
    resident = make_plan(hw, layout, PlanOptions()).speed
    squeezed = replace(hw, memory=replace(hw.memory, available=300 * 1024**3))
    plan = make_plan(squeezed, layout, PlanOptions())
    assert plan.verdict == "stream"
    assert plan.speed.expected_tps < resident.expected_tps / 2
    assert plan.speed.bottleneck.startswith("disk reads")
    slower_disk = make_plan(squeezed, layout, PlanOptions(disk_read_bps=1e9)).speed
    assert slower_disk.expected_tps < plan.speed.expected_tps


def test_only_the_used_share_of_experts_is_read_per_token(
    machine: Machine, estimated: Layout
) -> None:
    hw = machine("8xH100-2TB")
    layout = estimated("grearl-iq1s")
    plan = make_plan(hw, layout, PlanOptions(n_cpu_moe=93))
    ram_bytes = plan.speed.bytes_per_token["RAM"]
    assert ram_bytes == pytest.approx(layout.expert_bytes * 16 / 896, rel=0.001)


def test_a_stream_plan_goes_at_the_disk_the_machine_has(
    machine: Machine, estimated: Layout
) -> None:
    """The rate of the disk the hardware describes (measured, or its kind's) replaces
    the assumed NVMe rate, in the speed, the load time and the words."""
    from k3desk.core.hardware.profile import DiskInfo

    hw = machine("epyc9554p-1.5TB-cpu")
    layout = estimated("grearl-iq1s")
    squeezed = replace(hw, memory=replace(hw.memory, available=300 * 1024**3))
    assumed = make_plan(squeezed, layout, PlanOptions())
    assert any("assumed" in n for n in assumed.notes)
    hdd = Bandwidth(0.2e9, "table", "spinning disk sda")
    on_hdd = squeezed.with_disk(DiskInfo("/m", "/m", 10**12, 2 * 10**12, "ext4", read_rate=hdd))
    slow = make_plan(on_hdd, layout, PlanOptions())
    assert slow.verdict == "stream"
    assert slow.speed.expected_tps < assumed.speed.expected_tps / 5
    assert slow.load_seconds > 10 * assumed.load_seconds
    assert any("0.2 GB/s, table: spinning disk sda" in n for n in slow.notes)
    # a rate the caller measured on the shards wins over the file's
    measured = PlanOptions(disk_read_bps=2e9, disk_read_note="2.0 GB/s, measured: nvme0n1")
    assert make_plan(on_hdd, layout, measured).speed.expected_tps > slow.speed.expected_tps
    # unknown in the file: the assumption, said so
    unknown = squeezed.with_disk(DiskInfo("/m", "/m", 10**12, 2 * 10**12, "ext4"))
    assert make_plan(unknown, layout, PlanOptions()).speed == assumed.speed
