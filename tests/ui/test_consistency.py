"""One figure, one value, in every shell: for every tier and every shipped hardware file, what
``k3desk tiers --json`` says is what the wizard's fit chart draws, what its tiers table and
the Models page's table show, and what ``k3desk tiers`` prints.

The widgets are real and read as displayed: table cells and their tooltips, and the
strings the chart painted when it was grabbed.  The numbers are checked against the
planner's own figures in the JSON (``server_args`` for the ``--n-cpu-moe`` a launch
would use), so a shell that derived a figure of its own would disagree here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import k3desk.cli
from k3desk.core.units import fmt_bytes, fmt_tps
from k3desk.ui.tiers import SPEED_COLUMN, VERDICT_COLUMN
from k3desk.ui.window import MainWindow
from tests.fixtures.hardware import HARDWARE_DIR

FILES = sorted(p.name for p in HARDWARE_DIR.glob("*.json"))


def cli(services: Any, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc = k3desk.cli.main(list(args), services)
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def table_cells(table: Any) -> dict[str, dict[str, str]]:
    """tier id -> what its row shows: verdict, its tooltip, speed, its tooltip, the name."""
    out = {}
    for r, row in enumerate(table.rows):
        out[row.tier.id] = {
            "name": table.item(r, 0).text(),
            "verdict": table.item(r, VERDICT_COLUMN).text(),
            "verdict_tip": table.item(r, VERDICT_COLUMN).toolTip(),
            "speed": table.item(r, SPEED_COLUMN).text(),
            "speed_tip": table.item(r, SPEED_COLUMN).toolTip(),
        }
    return out


def need_text(resource: str, need: int, have: int) -> str:
    """How a need against a budget reads: 'RAM 12.0 GiB / 40.0 GiB' or 'RAM: 2.0 GiB short'."""
    if need <= have:
        return f"{resource} {fmt_bytes(need)} / {fmt_bytes(have)}"
    return f"{resource}: {fmt_bytes(need - have)} short"


def arg_value(args: list[str] | None, flag: str) -> str | None:
    if not args or flag not in args:
        return None
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("name", FILES)
def test_every_shell_shows_the_same_figures_for_every_tier(  # type: ignore[no-untyped-def]
    ctx, qtbot, capsys, name: str
) -> None:
    hw_file = HARDWARE_DIR / name
    data = json.loads(cli(ctx.services, capsys, "tiers", "--hardware", str(hw_file), "--json"))
    text = cli(ctx.services, capsys, "tiers", "--hardware", str(hw_file))
    assert data["judged"] == {
        "kind": "file",
        "name": data["hardware"],
        "path": str(hw_file),
        "engine": None,
    }

    window = MainWindow(ctx)
    qtbot.addWidget(window)
    window.show()
    hardware = ctx.hardware
    hardware.load_file(hw_file)
    qtbot.waitUntil(
        lambda: hardware.judgement is not None and hardware.from_file == hw_file, timeout=60_000
    )
    models = window.models_page()
    window.show_page("models")
    wiz = window.open_wizard()
    chart = wiz.machine.chart
    chart.resize(1000, chart.height())
    chart.grab()  # paints: chart.painted holds every string drawn
    painted = chart.painted
    wiz.next()
    assert wiz.current_key() == "tiers"
    shells = {"wizard": table_cells(wiz.tiers.table), "models": table_cells(models.table)}

    # the headline: the same summary on the Models page and the tiers step, and which
    # machine it is for
    assert models.summary.text() == wiz.tiers.reason.text() == data["summary"]
    assert data["summary"] in text
    assert hw_file.name in models.judged_bar.text.text()
    assert models.judged_bar.back.isVisibleTo(models)

    ids = [t["id"] for t in data["tiers"]]
    for shell in shells.values():
        assert list(shell) == ids  # every tier, in the same (quality) order
    chart_rows = [f"{t['name']} · {t['publisher']}" for t in data["tiers"]]
    assert [r.name for r in chart.rows] == chart_rows
    pick = data["recommended"] or data["closest"]
    for t, crow in zip(data["tiers"], chart.rows, strict=True):
        tid, verdict = t["id"], t["verdict_text"]
        starred = tid == pick
        # ★ the recommendation, ☆ the closest option when nothing is recommended
        mark = "★ " if tid == data["recommended"] else "☆ "
        where = f"{name}: {tid}"
        # the verdict, in one vocabulary
        for shell in shells.values():
            cells = shell[tid]
            assert cells["verdict"] == verdict, where
            assert cells["name"].startswith(mark) == starred, where
        assert crow.verdict == verdict, where
        assert verdict in painted, where
        assert ((mark + chart_rows[ids.index(tid)]) in painted) == starred, where
        assert verdict in text, where
        # the shortfall: in the verdict wherever the tier misses RAM, and on the RAM bar
        short = t["shortfall_bytes"]
        if t["verdict"] == "stream":
            assert short == t["stream_bytes"] > 0, where
            assert verdict == f"streams from disk: {fmt_bytes(short)} beyond RAM", where
        elif t["verdict"] == "no-fit":
            assert verdict == f"won't fit: {fmt_bytes(short)} short of RAM", where
        else:
            assert short == 0, where
        # what the tier needs of each resource against what the plan may use there
        needs = t["needs"]
        if t["verdict"] != "n/a":
            ram = needs["ram"]
            assert max(0, ram["need_bytes"] - ram["have_bytes"]) == short, where
        bars = {b.resource.lower(): b for b in crow.bars}
        assert set(bars) == set(needs), where
        for res, n in needs.items():
            shown = need_text(
                res.upper() if res != "disk" else "Disk", n["need_bytes"], n["have_bytes"]
            )
            assert (bars[res].need, bars[res].have) == (n["need_bytes"], n["have_bytes"]), where
            assert shown in painted, (where, shown)
            for shell in shells.values():
                assert shown in shell[tid]["verdict_tip"], (where, shown)
        # the offload: the --n-cpu-moe a launch would use, and the layers it moves
        n_cpu_moe = arg_value(t["server_args"], "--n-cpu-moe")
        if t["verdict"] == "hybrid":
            assert t["n_cpu_moe"] == int(n_cpu_moe or 0), where
            # --n-cpu-moe N keeps layers 0..N-1 in RAM; layer 0 is dense (no experts)
            on_cpu = t["n_cpu_moe"] - 1 if t["n_cpu_moe"] else t["expert_layers_on_cpu"]
            assert t["expert_layers_on_cpu"] == on_cpu, where
            layers = "layer" if on_cpu == 1 else "layers"
            assert verdict == f"hybrid: {on_cpu} expert {layers} on CPU", where
            if t["n_cpu_moe"]:
                for shell in shells.values():
                    assert f"--n-cpu-moe {t['n_cpu_moe']}" in shell[tid]["verdict_tip"], where
                assert f"(--n-cpu-moe {t['n_cpu_moe']})" in text, where
        # the speed: only for a tier that runs here, the same figures everywhere
        if t["expected_tps"] is None:
            assert t["verdict"] in ("no-fit", "n/a"), where
            for shell in shells.values():
                assert shell[tid]["speed"] == "—", where
        else:
            low, high = t["tps_range"]
            for shell in shells.values():
                assert shell[tid]["speed"] == f"{fmt_tps(t['expected_tps'])} tok/s", where
                assert shell[tid]["speed_tip"].startswith(
                    f"{fmt_tps(low)}-{fmt_tps(high)} tok/s"
                ), where
            assert f"{verdict}" in text, where


def test_the_fit_chart_never_doubles_a_shortfall(ctx, qtbot, hardware_file) -> None:  # type: ignore[no-untyped-def]
    """The case that read "5.4 TiB short" for a 2.7 TiB tier: the RAM bar's shortfall is
    the plan's, never more than the whole tier."""
    hardware = ctx.hardware
    hardware.load_file(hardware_file("no-gpu-laptop-32GB"))
    qtbot.waitUntil(lambda: hardware.judgement is not None, timeout=60_000)
    for row in hardware.judgement.rows:
        ram = row.need("RAM")
        assert ram is not None
        assert ram.short == row.shortfall <= row.tier.size_bytes + 64 * 2**30, row.tier.id


def test_the_disk_read_rate_reads_the_same_in_the_wizard_and_in_doctor() -> None:
    """The rate every streaming plan divides by: the wizard's machine summary says what
    ``k3desk doctor`` says, for a measured disk and for an unknown one."""
    from dataclasses import replace

    from k3desk.cli.doctor import render
    from k3desk.core.hardware.profile import Bandwidth, DiskInfo, HardwareProfile
    from k3desk.ui.wizard.machine import machine_html

    base = HardwareProfile.from_json_file(HARDWARE_DIR / "no-gpu-laptop-32GB.json")
    disk = DiskInfo("/m", "/m", 10**12, 2 * 10**12, "ext4")
    for rate in (
        Bandwidth(1.9e9, "measured", "nvme0n1, 256 MiB of k3.gguf read"),
        Bandwidth(0.0, "unknown", "virtual disk vda"),
    ):
        hw = base.with_disk(replace(disk, read_rate=rate))
        doctor = next(ln for ln in render(hw).splitlines() if "Read rate" in ln)
        shown = doctor.split("Read rate", 1)[1].strip()
        assert shown in machine_html(hw)
        assert ("1.9 GB/s" in shown) == (rate.source == "measured")
