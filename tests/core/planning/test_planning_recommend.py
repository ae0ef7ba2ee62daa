"""Which tier to download: verdicts per tier, the recommendation and the reasons."""

from __future__ import annotations

from collections.abc import Callable

from k3desk.core.catalog.loader import Catalog
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.recommend import recommend
from k3desk.core.units import fmt_bytes

Machine = Callable[[str], HardwareProfile]


def test_quality_order_puts_more_expert_bits_and_unpruned_tiers_first(
    machine: Machine, twin_catalog: Catalog
) -> None:
    rec = recommend(machine("epyc9554p-1.5TB-cpu"), twin_catalog)
    order = [v.tier.id for v in rec.verdicts]
    assert order.index("atomicchat-q3ks") < order.index("atomicchat-iq2xxs")
    assert order.index("atomicchat-iq2xxs") < order.index("atomicchat-iq1m")
    assert order.index("atomicchat-iq1m") < order.index("grearl-iq1s")
    # pruned tiers rank below every full IQ1_S tier
    full = [order.index(t) for t in ("grearl-iq1s", "6block-iq1s-xs", "atomicchat-iq1s")]
    assert max(full) < order.index("6block-iq1s-xxs-832e") < order.index("vcruz305-ud-iq1s")
    assert [v.rank for v in rec.verdicts] == list(range(1, len(order) + 1))
    assert "routed-expert bits" in rec.ordering_rule


def test_epyc_gets_the_best_tier_that_fits_in_ram(machine: Machine, twin_catalog: Catalog) -> None:
    rec = recommend(machine("epyc9554p-1.5TB-cpu"), twin_catalog)
    assert rec.best is not None
    assert rec.best.tier.id == "atomicchat-q3ks"
    assert rec.best.verdict == "cpu"
    assert "Q3_K_S (AtomicChat)" in rec.summary
    for v in rec.verdicts:
        if v.tier.reference:
            assert v.why_not == "a reference tier, not meant for local use"
        elif v.rank > rec.best.rank:
            assert v.fits
            assert "ranks lower in quality" in v.why_not


def test_rtx5090_gets_no_resident_tier_but_the_closest_streaming_one(
    machine: Machine, twin_catalog: Catalog
) -> None:
    rec = recommend(machine("1xRTX5090-256GB"), twin_catalog)
    assert rec.best is None
    assert rec.closest is not None
    assert rec.closest.verdict == "stream"
    assert rec.closest.tier.id == "vcruz305-ud-iq1s"
    assert fmt_bytes(rec.closest.shortfall) in rec.summary
    assert all(v.verdict in ("stream", "no-fit") for v in rec.verdicts)
    grearl = next(v for v in rec.verdicts if v.tier.id == "grearl-iq1s")
    assert grearl.why_not.startswith(
        f"IQ1_S (GrEarl) would need {fmt_bytes(grearl.shortfall)} more RAM"
    )


def test_512gb_machine_names_how_much_the_better_tiers_miss(
    machine: Machine, twin_catalog: Catalog
) -> None:
    rec = recommend(machine("512GB-ddr5-96GB-vram"), twin_catalog)
    assert rec.best is not None
    assert rec.best.verdict == "hybrid"
    above = [v for v in rec.verdicts if v.rank < rec.best.rank and not v.tier.reference]
    assert above, "better tiers exist and do not fit"
    for v in above:
        assert not v.fits
        assert f"would need {fmt_bytes(v.shortfall)} more RAM" in v.why_not


def test_disk_space_is_noted_before_download(machine: Machine, twin_catalog: Catalog) -> None:
    rec = recommend(machine("no-gpu-laptop-32GB"), twin_catalog)
    xs = next(v for v in rec.verdicts if v.tier.id == "6block-iq1s-xs")
    assert "needs 539.7 GiB of disk" in xs.disk_note
    assert rec.best is None
    assert rec.closest is not None


def test_gb10_node_is_told_about_the_three_node_engine(
    machine: Machine, twin_catalog: Catalog
) -> None:
    rec = recommend(machine("3xGB10-node"), twin_catalog)
    assert rec.best is None
    assert len(rec.notes) == 1
    assert rec.notes[0].startswith("UD-IQ1_S (vcruz305) also runs on SparkInfer across three GB10")
    assert recommend(machine("8xH100-2TB"), twin_catalog).notes == ()
