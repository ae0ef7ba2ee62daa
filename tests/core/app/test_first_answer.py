"""The first answer when nothing fits: on this machine and every shipped hardware file, the
pick never needs more disk than there is free (when some download fits), "closest" is the
tier missing the least memory, and the summary says what memory would make it run, at
what speed, and its download against the free disk."""

from __future__ import annotations

from dataclasses import replace

import pytest

from k3desk.core.app.services import Services
from k3desk.core.app.subject import Subject, judged_machine
from k3desk.core.app.tiers import TierJudgement, TierRequest, TierRow, judge_tiers
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.units import GiB, fmt_bytes, fmt_tps
from tests.fixtures.hardware import HARDWARE_DIR

FILES = sorted(p.stem for p in HARDWARE_DIR.glob("*.json"))


def _judge(services: Services, hw: HardwareProfile, subject: Subject) -> TierJudgement:
    return judge_tiers(TierRequest(hw, subject), services.catalog)


def _fits_disk(row: TierRow) -> bool:
    disk = row.need("Disk")
    return disk is None or disk.fits


def _check_first_answer(judged: TierJudgement) -> None:
    """The rules of the first answer, for any machine."""
    hw = judged.hardware
    candidates = [r for r in judged.rows if not r.tier.reference and r.plan is not None]
    on_disk = [r for r in candidates if _fits_disk(r)]
    chosen = judged.chosen
    assert chosen is not None
    starred = [r.tier.id for r in judged.rows if r.recommended]
    assert starred == [chosen.tier.id]
    if on_disk:  # never prefer a download that does not fit the free disk
        assert _fits_disk(chosen), (chosen.tier.id, judged.summary)
    pool = on_disk or candidates
    summary = judged.summary
    assert hw.disk is not None
    # the download against the free disk, in the summary
    assert f"Download: {fmt_bytes(chosen.tier.size_bytes)}; " in summary
    assert f"{fmt_bytes(hw.disk.free)} free." in summary
    if not on_disk:  # the disk first
        assert summary.startswith("No tier's download fits the free disk: ")
    if judged.best is not None:
        # the best-quality tier that fits in memory among those that fit the disk
        fitting = [r for r in pool if r.fits]
        assert chosen.tier.id in {r.tier.id for r in fitting}
        assert all(r.verdict.rank >= chosen.verdict.rank or not r.tier.known for r in fitting)
        return
    # nothing fits in memory: the closest misses it by the least
    least = min(r.verdict.memory_short for r in pool)
    assert chosen.verdict.memory_short == least, (chosen.tier.id, summary)
    assert "missing the least memory" in summary
    assert f"it misses RAM by {fmt_bytes(least)}" in summary
    resident = chosen.verdict.resident
    assert resident is not None, chosen.tier.id
    # what memory would make it resident or hybrid, and at what speed
    assert resident.verdict in ("cpu", "hybrid", "gpu")
    assert f"at about {fmt_tps(resident.expected_tps)} tok/s" in summary
    assert resident.extra_ram >= least


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("free_gib", [None, 400, 100])
def test_every_shipped_machine_gets_a_first_answer_it_can_follow(
    name: str, free_gib: int | None
) -> None:
    services = Services()
    path = HARDWARE_DIR / f"{name}.json"
    hw = services.load_hardware(path)
    if free_gib is not None:  # the same machine with less free disk
        assert hw.disk is not None
        hw = hw.with_disk(replace(hw.disk, free=free_gib * GiB))
    _check_first_answer(_judge(services, hw, Subject.hardware_file(path, hw)))


def test_this_machine_gets_a_first_answer_it_can_follow() -> None:
    services = Services()
    hw, subject = judged_machine(services, None)
    _check_first_answer(_judge(services, hw, subject))


def test_the_laptop_is_pointed_at_the_one_tier_its_disk_holds() -> None:
    """The 32 GB laptop: nothing fits in RAM; UD-IQ1_S misses it by the least and is the
    only download its 326 GiB of free disk holds, not the fastest to stream."""
    services = Services()
    path = HARDWARE_DIR / "no-gpu-laptop-32GB.json"
    hw = services.load_hardware(path)
    judged = _judge(services, hw, Subject.hardware_file(path, hw))
    assert judged.best is None
    closest = judged.closest
    assert closest is not None
    assert closest.tier.id == "vcruz305-ud-iq1s"
    summary = judged.summary
    assert "The closest (of the tiers whose download fits the free disk, the one missing " in (
        summary
    )
    assert "Download: 307.5 GiB; /home/user/.local/share has 326.0 GiB free." in summary
    short = fmt_bytes(closest.verdict.memory_short)
    assert f"it misses RAM by {short}; with that much more free RAM it would run from RAM" in (
        summary
    )
    # the others are told apart by what they miss, disk included
    q3 = judged.row("atomicchat-q3ks")
    assert q3 is not None
    assert "its download needs 1.1 TiB of disk" in q3.verdict.why_not


def test_a_tier_that_fits_in_memory_but_not_on_the_disk_is_passed_over_and_said() -> None:
    services = Services()
    path = HARDWARE_DIR / "epyc9554p-1.5TB-cpu.json"
    hw = services.load_hardware(path)
    assert hw.disk is not None
    small = hw.with_disk(replace(hw.disk, free=600 * GiB))
    judged = _judge(services, small, Subject.hardware_file(path, small))
    best = judged.best
    assert best is not None
    assert best.tier.size_bytes <= 600 * GiB
    assert best.tier.id == "atomicchat-iq1s"  # Q3_K_S, IQ2_XXS, IQ1_M fit in RAM, not on disk
    assert judged.summary.startswith(
        "Q3_K_S (AtomicChat) would run here (cpu), but its download (1.1 TiB) does not fit "
        "the free disk: /data has 600.0 GiB free. Recommended for "
    )
    q3 = judged.row("atomicchat-q3ks")
    assert q3 is not None
    assert q3.verdict.why_not.startswith("fits in memory, but its download needs 1.1 TiB")


def test_download_of_a_repository_id_names_repo(capsys: pytest.CaptureFixture[str]) -> None:
    import k3desk.cli

    services = Services()
    rc = k3desk.cli.main(["download", "someone/Other-K3-GGUF"], services)
    err = capsys.readouterr().err
    assert rc != 0
    assert "'someone/Other-K3-GGUF' looks like a Hub repository, not a tier id" in err
    assert "--repo someone/Other-K3-GGUF --include" in err
    # a catalog repository: its tiers' ids
    rc = k3desk.cli.main(["download", "vcruz305/Kimi-K3-GGUF"], services)
    err = capsys.readouterr().err
    assert rc != 0
    assert "the catalog's tiers from it: vcruz305-ud-iq1s" in err
    assert "`k3desk download vcruz305-ud-iq1s`" in err

