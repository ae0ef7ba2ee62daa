"""Streaming plans order as physics orders them, on every shipped machine and this one.

A plan that streams from disk is a sum of what the token reads and computes: more
RAM (a larger page cache) can only lower the bytes read from disk, a faster disk can
only lower their time, fewer bytes read at the same compute can only lower the time
per token, and of two tiers the one that reads fewer bytes from disk per token is the
faster where the disk is the bound.  Each is checked over every hardware file in
``resources/hardware`` and over this 24 GiB, 2-core machine as measured
(``bench/stream_real.py``), for the catalog's streaming tiers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from k3desk.core.gguf.model import ModelLayout
from k3desk.core.hardware.bandwidth import fill_missing_bandwidths
from k3desk.core.hardware.profile import Bandwidth, DiskInfo, HardwareProfile
from k3desk.core.planning.model import LaunchPlan, PlanOptions
from k3desk.core.planning.plan import make_plan
from k3desk.core.planning.speed import predict_speed
from k3desk.core.units import GiB

Layout = Callable[[str], ModelLayout]
HARDWARE = Path(__file__).resolve().parents[3] / "resources" / "hardware"
SHIPPED = sorted(p.stem for p in HARDWARE.glob("*.json"))
THIS_MACHINE = "this machine (24 GiB, 2 cores, virtio disk at 1.1 GB/s)"
MACHINES = [*SHIPPED, THIS_MACHINE]
# the tiers from the narrowest experts to the widest bits
TIERS = ("vcruz305-ud-iq1s", "grearl-iq1s", "atomicchat-iq2xxs", "atomicchat-q3ks")
SLACK = 1e-9  # float noise only


def profile(name: str) -> HardwareProfile:
    if name != THIS_MACHINE:
        return fill_missing_bandwidths(HardwareProfile.from_json_file(HARDWARE / f"{name}.json"))
    # the machine bench/stream_real.py ran on: 2 cores of an AMD EPYC, 24 GiB, its
    # RAM copy benchmark and the disk rate measured on the model file (O_DIRECT)
    laptop = fill_missing_bandwidths(
        HardwareProfile.from_json_file(HARDWARE / "no-gpu-laptop-32GB.json")
    )
    cpu = replace(laptop.cpu, model="AMD EPYC", logical_cores=2, physical_cores=2,
                  usable_cores=2)  # fmt: skip
    memory = replace(
        laptop.memory,
        total=24 * GiB,
        available=22 * GiB,
        swap_total=0,
        bandwidth=Bandwidth(14e9, "measured", "copy benchmark, 2 threads"),
    )
    rate = Bandwidth(1.1e9, "measured", "vda, 256 MiB read with the page cache bypassed")
    disk = DiskInfo("/work/stream-real", "/work/stream-real", 80 * 10**9, 252 * 10**9, "ext4",
                    read_rate=rate)  # fmt: skip
    return replace(laptop, cpu=cpu, memory=memory, disk=disk, label=THIS_MACHINE)


def with_ram(hw: HardwareProfile, factor: float) -> HardwareProfile:
    m = hw.memory
    return replace(
        hw, memory=replace(m, total=round(m.total * factor), available=round(m.available * factor))
    )


def with_disk_rate(hw: HardwareProfile, bps: float) -> HardwareProfile:
    disk = hw.disk or DiskInfo("/m", "/m", 10**12, 2 * 10**12, "ext4")
    return hw.with_disk(replace(disk, read_rate=Bandwidth(bps, "measured", "test")))


def tps(plan: LaunchPlan) -> float:
    return plan.speed.expected_tps


@pytest.fixture(scope="module")
def layouts() -> dict[str, ModelLayout]:
    from k3desk.core.catalog.loader import load_catalog
    from k3desk.core.planning.estimate import estimate_layout
    from k3desk.core.resources import resources_dir

    catalog = load_catalog(resources_dir() / "catalog.json")
    return {t: estimate_layout(catalog.get(t)) for t in TIERS}


@pytest.mark.parametrize("name", MACHINES)
def test_more_ram_is_never_slower(name: str, layouts: dict[str, ModelLayout]) -> None:
    hw = profile(name)
    for tier, layout in layouts.items():
        speeds = [tps(make_plan(with_ram(hw, f), layout, PlanOptions())) for f in
                  (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 4.0)]  # fmt: skip
        for less, more in itertools.pairwise(speeds):
            assert more >= less * (1 - SLACK), (tier, speeds)


@pytest.mark.parametrize("name", MACHINES)
def test_a_faster_disk_is_never_slower(name: str, layouts: dict[str, ModelLayout]) -> None:
    hw = profile(name)
    for tier, layout in layouts.items():
        plans = [make_plan(with_disk_rate(hw, bps), layout, PlanOptions()) for bps in
                 (0.09e9, 0.2e9, 0.53e9, 1.1e9, 3.5e9, 7e9, 14e9)]  # fmt: skip
        speeds = [tps(p) for p in plans]
        for slow, fast in itertools.pairwise(speeds):
            assert fast >= slow * (1 - SLACK), (tier, speeds)
        if plans[0].verdict == "stream":
            assert speeds[-1] > speeds[0], (tier, "a stream plan must gain from its disk")


@pytest.mark.parametrize("name", MACHINES)
def test_fewer_bytes_read_from_disk_is_never_slower(
    name: str, layouts: dict[str, ModelLayout]
) -> None:
    """The same placement and compute, fewer page-cache misses: never slower."""
    hw = profile(name)
    for tier, layout in layouts.items():
        plan = make_plan(hw, layout, PlanOptions())
        last = 0.0
        for miss in (1.0, 0.8, 0.5, 0.2, 0.0):
            for dense in (1.0, 0.5, 0.0):
                s = predict_speed(hw, layout, plan.layers, plan.output_device, ctx=plan.ctx,
                                  stream_miss=miss, dense_miss=dense * miss)  # fmt: skip
                assert s.expected_tps > 0
            s = predict_speed(hw, layout, plan.layers, plan.output_device, ctx=plan.ctx,
                              stream_miss=miss)  # fmt: skip
            assert s.expected_tps >= last * (1 - SLACK), (tier, miss)
            assert s.bytes_per_token.get("disk", 0) <= (
                predict_speed(hw, layout, plan.layers, plan.output_device, ctx=plan.ctx,
                              stream_miss=1.0).bytes_per_token.get("disk", 0)
            )  # fmt: skip
            last = s.expected_tps


def _disk_share(plan: LaunchPlan) -> float:
    disk = sum(s for label, s in plan.speed.steps if "read from disk" in label)
    return disk * plan.speed.expected_tps


@pytest.mark.parametrize("name", MACHINES)
def test_where_the_disk_is_the_bound_the_tier_that_reads_less_is_faster(
    name: str, layouts: dict[str, ModelLayout]
) -> None:
    hw = profile(name)
    plans = {t: make_plan(hw, layout, PlanOptions()) for t, layout in layouts.items()}
    bound = {t: p for t, p in plans.items() if p.verdict == "stream" and _disk_share(p) > 0.8}
    for a, pa in bound.items():
        for b, pb in bound.items():
            if pa.speed.bytes_per_token["disk"] < pb.speed.bytes_per_token["disk"]:
                assert tps(pa) > tps(pb), (a, b)


def test_ud_iq1s_outruns_q3ks_wherever_its_every_token_weights_stay_cached(
    layouts: dict[str, ModelLayout],
) -> None:
    """UD-IQ1_S reads a quarter of Q3_K_S's expert bytes per token but twice its
    attention and shared weights (Q8_0): where those stay in the page cache it must be
    the faster; where they do not (24-32 GiB), it reads more per token and is the
    slower, and the plan says which weights miss."""
    ud, q3 = layouts["vcruz305-ud-iq1s"], layouts["atomicchat-q3ks"]
    checked = 0
    for name in MACHINES:
        hw = profile(name)
        pu, pq = make_plan(hw, ud, PlanOptions()), make_plan(hw, q3, PlanOptions())
        if pq.verdict != "stream":
            continue
        if pu.verdict != "stream" or pu.speed.bytes_per_token.get("disk", 0) < (
            pq.speed.bytes_per_token.get("disk", 0)
        ):
            assert tps(pu) > tps(pq), name
            checked += 1
        else:
            assert tps(pu) < tps(pq), name
    assert checked >= 3


def test_a_missed_expert_reads_the_whole_read_around_window(
    layouts: dict[str, ModelLayout],
) -> None:
    """On the rehearsal's disk (read_ahead_kb 8192: 16 MiB around each fault) a missed
    UD-IQ1_S expert slice (1.07 MB) costs the window's uncached pages, and the token
    reads about that many times more than its slices (bench/stream_real.py measured
    6.0 GB per token where the slices were 0.49 GB); Linux's default window (256 KiB
    with llama.cpp's fadvise) is narrower than any tier's slice and adds nothing."""
    hw = profile(THIS_MACHINE)
    for tier, slice_mb in (("vcruz305-ud-iq1s", 1.07), ("atomicchat-q3ks", 4.6)):
        layout = layouts[tier]
        plan = make_plan(hw, layout, PlanOptions())
        assert plan.verdict == "stream"

        def disk(
            window: int, miss: float, lay: ModelLayout = layout, p: LaunchPlan = plan
        ) -> float:
            s = predict_speed(hw, lay, p.layers, p.output_device, ctx=p.ctx, stream_miss=miss,
                              read_around=window)  # fmt: skip
            return float(s.bytes_per_token.get("disk", 0))

        default = disk(256 * 1024, 0.8)
        assert disk(0, 0.8) == pytest.approx(default)  # the slice is the unit
        wide = disk(16 * 2**20, 0.8)
        expected = max(1.0, 16 * 2**20 * 0.8 / (slice_mb * 1e6))
        assert wide / default == pytest.approx(expected, rel=0.05), tier
        assert disk(16 * 2**20, 0.4) < wide / 2  # fewer misses: fewer and smaller reads


def test_a_stream_plan_says_what_a_token_costs_and_what_would_help(
    layouts: dict[str, ModelLayout],
) -> None:
    hw = profile(THIS_MACHINE)
    plan = make_plan(hw, layouts["vcruz305-ud-iq1s"], PlanOptions())
    assert plan.verdict == "stream"
    (note,) = [n for n in plan.notes if n.startswith("Streaming costs about")]
    per_token = 1 / plan.speed.expected_tps
    assert f"{per_token:.1f} s per token" in note
    assert "of the disk's 1.1 GB/s (measured)" in note
    faster = make_plan(with_disk_rate(hw, 2.2e9), layouts["vcruz305-ud-iq1s"], PlanOptions())
    assert f"A disk twice as fast: {1 / faster.speed.expected_tps:.1f} s per token" in note
    # its attention and shared weights (Q8_0, 55 GiB) miss the cache on 24 GiB too
    assert "more free RAM would keep the weights every token reads cached" in note
    assert "more free RAM (the whole model resident): " in note
