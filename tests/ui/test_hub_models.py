"""'On the Hub' on the Models page: the stand-in's K3 sets, each with a verdict from its
real headers; the catalog alone, said so, when the Hub cannot be reached."""

from __future__ import annotations

from PySide6.QtCore import Qt

from k3desk.ui.pages import PageKey
from k3desk.ui.window import MainWindow
from tests.hubserver import HubServer


def test_the_models_page_lists_the_hubs_sets_with_a_verdict_each(  # type: ignore[no-untyped-def]
    ctx, qtbot, tiny_k3, twin_factory, hardware_file
) -> None:
    ctx.hardware.load_file(hardware_file("1xH200-141GB"))
    w = MainWindow(ctx)
    qtbot.addWidget(w)
    w.resize(1280, 900)
    w.show()
    w.show_page(PageKey.MODELS)
    hub_view = w.models_page().hub
    w.models_page().sources.setCurrentWidget(hub_view)
    qtbot.waitUntil(lambda: ctx.hardware.judgement is not None, timeout=60_000)
    with HubServer() as hub:
        twin = twin_factory("grearl-iq1s")
        hub.add_repo("GrEarl/Kimi-K3-GGUF-IQ1_S", {p.name: p for p in twin}, hash_content=False)
        six = {
            p.name: p for t in ("6block-iq1s-xs", "6block-iq1s-xxs-832e") for p in twin_factory(t)
        }
        six["Kimi-K3-mmproj-BF16.gguf"] = tiny_k3.mmproj  # a projector beside the sets
        hub.add_repo("6block/Kimi-K3-GGUF", six, hash_content=False)
        files = {f"IQ1_S/{p.name}": p.read_bytes() for p in tiny_k3.parts}
        hub.add_repo("tester/Kimi-K3-Tiny-GGUF", files)
        hub_view.endpoint = hub.endpoint
        qtbot.mouseClick(hub_view.button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: hub_view.result is not None, timeout=120_000)
    rows = hub_view.rows()
    assert [(r[1], r[4]) for r in rows] == [
        ("Kimi-K3-IQ1_S-XS", "6block-iq1s-xs"),
        ("Kimi-K3-IQ1_S-XXS-832e", "6block-iq1s-xxs-832e"),
        ("Kimi-K3-IQ1_S", "grearl-iq1s"),
        ("IQ1_S/Tiny-K3-IQ1_S", "-"),
    ]
    assert all(r[6] == "real headers" for r in rows)
    assert rows[3][5].startswith("GPU: everything on the GPUs")
    assert "4 sets in 3 repositories" in hub_view.status.text()
    # the card's facts and the repository's projector, where a set is a catalog tier
    tip = hub_view.table.item(0, 4).toolTip()
    assert "Kimi-K3-mmproj-BF16.gguf" in tip
    hub_view.table.selectRow(2)
    details = hub_view.details.text()
    assert "From the real headers of all 94 parts" in details
    assert "--include 'Kimi-K3-IQ1_S-*-of-00094.gguf'" in details
    assert "1xH200" in hub_view.status.text()
    # the Hub gone: the catalog alone, and the page says so
    hub_view.result = None
    qtbot.mouseClick(hub_view.button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: hub_view.result is not None, timeout=60_000)
    assert hub_view.status.text().startswith("Catalog only (offline)")
    assert len(hub_view.rows()) >= 10
    assert all(r[6] == "catalog only (offline)" for r in hub_view.rows())
