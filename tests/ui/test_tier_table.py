"""The tier table says which tiers' files are guessed and what each rank rests on."""

from __future__ import annotations

from k3desk.core.app.subject import Subject
from k3desk.core.app.tiers import TierRequest, judge_tiers
from k3desk.core.catalog.loader import load_catalog
from k3desk.core.hardware.profile import HardwareProfile
from k3desk.core.resources import resources_dir
from k3desk.ui.tiers import TierTable


def test_guessed_files_and_the_basis_of_each_rank_are_in_the_table(qtbot) -> None:  # type: ignore[no-untyped-def]
    res = resources_dir()
    catalog = load_catalog(res / "catalog.json")
    path = res / "hardware" / "8xH100-2TB.json"
    hw = HardwareProfile.from_json_file(path)
    judged = judge_tiers(TierRequest(hw, Subject.hardware_file(path, hw)), catalog.tiers)
    table = TierTable()
    qtbot.addWidget(table)
    table.set_judgement(judged)
    rows = {table.rows[r].tier.id: r for r in range(table.rowCount())}

    q3 = table.item(rows["atomicchat-q3ks"], 0)
    assert q3.text() == "★ Q3_K_S  ·  AtomicChat"  # recommended, but its files are guessed:
    assert "Its files are guessed: the card does not list them" in q3.toolTip()
    size = table.item(rows["atomicchat-q3ks"], 3)
    assert size.text().endswith(" · guessed")
    assert "Its files are guessed" in size.toolTip()
    known = table.item(rows["6block-iq1s-xs"], 3)
    assert "guessed" not in known.text()
    grearl = table.item(rows["grearl-iq1s"], 0).toolTip()
    assert "rests on: IQ1_S experts (1.56 bpw)" in grearl
    assert "made without an importance matrix" in grearl
    assert "ranks lower in quality" in table.item(rows["grearl-iq1s"], 1).toolTip()
