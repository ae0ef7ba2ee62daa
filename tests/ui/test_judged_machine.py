"""Which machine is judged is explicit, and planning for a hardware file never changes what
is launched here.

The case this guards: after "Plan for other hardware" (8x H100) and Cancel, the Engine page
launched llama-server on a GPU-less machine with ``-ngl 99 -ts 6,1,0,0,0,0,0,0`` and said
the engine "leaves GPUs unused".
"""

from __future__ import annotations

import pytest

from k3desk.ui.pages import PageKey
from k3desk.ui.window import MainWindow


def arg(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


@pytest.mark.engine
@pytest.mark.slow
def test_planning_for_a_hardware_file_never_changes_what_is_launched_here(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, tiny_k3, hardware_file
) -> None:
    ctx.update_settings(engine_binary=str(llama_server), ctx=2048)
    here = ctx.services.this_machine()  # what a launch here must plan for
    window = MainWindow(ctx)
    qtbot.addWidget(window)
    window.show()
    hardware = ctx.hardware
    wiz = window.open_wizard()
    h100 = hardware_file("8xH100-2TB")
    hardware.load_file(h100)  # "Plan for other hardware…"
    qtbot.waitUntil(
        lambda: hardware.judgement is not None and hardware.from_file == h100, timeout=60_000
    )
    wiz.reject()  # Cancel

    # every page says which machine it judges, and offers the way back
    models = window.models_page()
    window.show_page(PageKey.MODELS)
    assert "8xH100-2TB.json" in models.judged_bar.text.text()
    assert models.judged_bar.back.isVisibleTo(models)
    engine_page = window.engine_page()
    window.show_page(PageKey.ENGINE)
    panel = engine_page.panel
    assert panel.judged_bar.isVisibleTo(engine_page)
    assert "8xH100-2TB.json" in panel.judged_bar.text.text()
    qtbot.waitUntil(lambda: bool(panel.rows) and panel.machine is not None, timeout=120_000)
    # the engines are judged for this machine: no GPU of the file is "left unused" here
    assert panel.machine.hostname == here.hostname
    assert panel.machine.gpus == here.gpus
    if not here.gpus:
        assert "GPUs unused" not in panel.engines_note.text()
    assert here.hostname in panel.target.text() or "this machine" in panel.target.text()

    # the launch plans for this machine, not for the 8 GPUs the pages judge
    panel.shard.setText(str(tiny_k3.first_part))
    panel.launch_btn.click()
    engine = ctx.engine
    qtbot.waitUntil(lambda: engine.request is not None, timeout=120_000)
    req = engine.request
    args = req.spec.args
    assert req.subject is not None
    assert req.subject.here
    ts = arg(args, "-ts")
    if len(here.gpus) > 1:
        assert ts is not None
        assert len(ts.split(",")) == len(here.gpus)
    else:
        assert ts is None, args
    if not here.gpus:
        assert arg(args, "-ngl") is None, args  # no GPU flag for an engine without GPUs
        assert req.plan is not None
        assert req.plan.verdict == "cpu"
    assert "Planned for this machine" in engine_page.plan_reason.text()
    qtbot.waitUntil(lambda: engine.ready or engine.state_name() == "crashed", timeout=120_000)
    engine.stop()
    qtbot.waitUntil(lambda: engine.state_name() == "stopped", timeout=60_000)

    # and the way back: the pages judge this machine again
    models.judged_bar.back.click()
    qtbot.waitUntil(
        lambda: hardware.judgement is not None and hardware.judging_here, timeout=60_000
    )
    assert not models.judged_bar.back.isVisibleTo(models)
    assert not panel.judged_bar.isVisibleTo(engine_page)
    assert "8xH100" not in models.judged_bar.text.text()
    assert hardware.judgement.subject.here
    assert models.summary.text() == hardware.judgement.summary
