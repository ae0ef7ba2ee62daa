"""Which tier to download: verdicts per tier, the recommendation and the reasons."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from k3desk.core.catalog.loader import Catalog
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.planning.recommend import recommend
from k3desk.core.units import GiB, fmt_bytes

Machine = Callable[[str], HardwareProfile]


def test_quality_order_puts_more_expert_bits_and_unpruned_tiers_first(
    machine: Machine, twin_catalog: Catalog
) -> None:
    rec = recommend(machine("epyc9554p-1.5TB-cpu"), twin_catalog)
    order = [v.tier.id for v in rec.verdicts]
    assert order.index("atomicchat-q3ks") < order.index("atomicchat-iq2xxs")
    assert order.index("atomicchat-iq2xxs") < order.index("atomicchat-iq1m")
    assert order.index("atomicchat-iq1m") < order.index("grearl-iq1s")
    # pruned tiers rank below every full IQ1_S tier made as llama.cpp requires
    full = [order.index(t) for t in ("6block-iq1s-xs", "atomicchat-iq1s")]
    assert max(full) < order.index("6block-iq1s-xxs-832e") < order.index("vcruz305-ud-iq1s")
    assert [v.rank for v in rec.verdicts] == list(range(1, len(order) + 1))
    assert "routed-expert bits" in rec.ordering_rule


def test_imatrix_and_measured_quality_enter_the_order_with_the_reason(
    machine: Machine, twin_catalog: Catalog
) -> None:
    """GrEarl's IQ1_S was made without an importance matrix (llama-quantize refuses IQ1_S
    without one) and its card measured only weight-space errors: it ranks below every
    IQ1_S tier that has both, even the pruned ones, and says why."""
    rec = recommend(machine("8xH100-2TB"), twin_catalog)
    by_id = {v.tier.id: v for v in rec.verdicts}
    grearl, xs = by_id["grearl-iq1s"], by_id["6block-iq1s-xs"]
    assert xs.rank < by_id["6block-iq1s-xxs-832e"].rank < grearl.rank
    assert grearl.rank == max(v.rank for v in rec.verdicts if v.tier.expert_quant == "IQ1_S")
    assert grearl.basis is not None
    assert grearl.basis.shortcomings == (
        "made without an importance matrix, which llama.cpp requires for IQ1_S "
        "('the result will be garbage')",
        "no end-to-end quality measured by its publisher",
    )
    assert grearl.fits
    assert grearl.why_not.endswith(
        f"ranks lower in quality (#{grearl.rank} vs #{rec.best.rank if rec.best else 0}): "
        + "; ".join(grearl.basis.shortcomings)
    )
    assert xs.basis is not None
    assert xs.basis.shortcomings == ()
    assert "with an importance matrix" in xs.basis.text()
    # an unstated imatrix is said so, and is no reason to rank lower
    vcruz = by_id["vcruz305-ud-iq1s"].basis
    assert vcruz is not None
    assert "importance matrix not stated" in vcruz.text()
    assert vcruz.shortcomings == ()
    assert "importance matrix" in rec.ordering_rule


def test_guessed_files_are_said_and_not_preferred_over_a_known_tier_of_similar_quality(
    machine: Machine, twin_catalog: Catalog
) -> None:
    # a machine where AtomicChat's IQ1_M (files guessed) fits and its bigger tiers do not
    big = machine("512GB-ddr5-96GB-vram")
    more = replace(big.memory, total=big.memory.total + 120 * GiB,
                   available=big.memory.available + 120 * GiB)  # fmt: skip
    hw = replace(big, memory=more)
    rec = recommend(hw, twin_catalog)
    by_id = {v.tier.id: v for v in rec.verdicts}
    iq1m = by_id["atomicchat-iq1m"]
    assert iq1m.fits
    assert not iq1m.tier.known
    assert not by_id["atomicchat-iq2xxs"].fits
    # IQ1_M ranks higher, but a known 1-bit tier that fits is recommended instead
    assert rec.best is not None
    assert rec.best.tier.known
    assert rec.best.tier.id == "atomicchat-iq1s"
    assert iq1m.rank < rec.best.rank
    assert iq1m.why_not == (
        "fits, but its files are guessed (the card does not list them): IQ1_S (AtomicChat) "
        "is a known tier of similar quality (1-bit experts) that fits too"
    )
    assert "Its files are guessed" not in rec.summary
    # where no known tier comes close (3-bit experts on 8x H100), the guessed one is
    # recommended, and the recommendation says what it rests on
    h100 = recommend(machine("8xH100-2TB"), twin_catalog)
    assert h100.best is not None
    assert h100.best.tier.id == "atomicchat-q3ks"
    assert h100.summary.endswith(
        "Its files are guessed: the card does not list them (file names, shard count "
        "derived); check the repository listing before downloading."
    )
    assert h100.best.basis is not None
    assert h100.best.basis.text().endswith("; files guessed")


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
