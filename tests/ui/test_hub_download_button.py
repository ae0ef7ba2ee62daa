"""A set found on the Hub is downloaded from its own Download button, with its vision
projector: on the Models page's "On the Hub" tab, and in the wizard's Hub table."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton

from k3desk.ui.pages import PageKey
from tests.hubserver import HubServer

REPO = "tester/Kimi-K3-Tiny-GGUF"
SET = "IQ1_S/Tiny-K3-IQ1_S"
MMPROJ = "mmproj-Tiny-K3-F16.gguf"


def _repo(tiny_k3) -> dict[str, bytes | Path]:  # type: ignore[no-untyped-def]
    files: dict[str, bytes | Path] = {f"IQ1_S/{p.name}": p.read_bytes() for p in tiny_k3.parts}
    files[MMPROJ] = tiny_k3.mmproj.read_bytes()
    files["mmproj-Tiny-K3-BF16.gguf"] = tiny_k3.mmproj.read_bytes() + b"\0"  # not this one
    files["README.md"] = b"# Tiny K3\n"
    return files


def _landed(folder: Path) -> set[str]:
    return {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    }


def test_the_hub_results_download_button_fetches_the_set_with_its_projector(  # type: ignore[no-untyped-def]
    window, qtbot, tiny_k3, hardware_file
) -> None:
    ctx = window.ctx
    ctx.hardware.load_file(hardware_file("1xH200-141GB"))
    window.show_page(PageKey.MODELS)
    page = window.models_page()
    hub_view = page.hub
    page.sources.setCurrentWidget(hub_view)
    qtbot.waitUntil(lambda: ctx.hardware.judgement is not None, timeout=60_000)
    with HubServer() as hub:
        files = _repo(tiny_k3)
        hub.add_repo(REPO, files)
        hub_view.endpoint = ctx.downloads.endpoint = hub.endpoint
        qtbot.mouseClick(hub_view.button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: hub_view.result is not None, timeout=120_000)
        names = [r[1] for r in hub_view.rows()]
        i = names.index(SET)
        button = hub_view.table.cellWidget(i, hub_view.table.columnCount() - 1)
        assert isinstance(button, QPushButton)
        assert button.text() == "Download"
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
        assert window.current_page() == PageKey.DOWNLOADS.value
        qtbot.waitUntil(
            lambda: (
                ctx.downloads.state is not None and ctx.downloads.state.status in ("done", "failed")
            ),
            timeout=120_000,
        )
        state = ctx.downloads.state
        assert state.status == "done", state.error
    parts = {name for name in files if name.startswith("IQ1_S/")}
    assert _landed(state.target) == parts | {MMPROJ}
    assert (state.target / MMPROJ).read_bytes() == files[MMPROJ]
    assert state.target.parent == ctx.services.paths.models_dir


def test_an_image_refused_for_a_set_without_its_projector_offers_to_fetch_it(  # type: ignore[no-untyped-def]
    ctx, qtbot, llama_server, tiny_k3, tmp_path
) -> None:
    """A set downloaded before projectors came with it: the chat refuses a picture, and
    the refusal's "Download the projector" fetches it into the set's folder."""
    from k3desk.core.app.downloads import DownloadJob, DownloadOptions, DownloadRequest
    from k3desk.core.engines.supervisor import LaunchSpec
    from k3desk.ui.chat.page import ChatPage
    from k3desk.ui.engine.controller import LaunchRequest
    from tests.ui.test_chat import png_file

    folder = ctx.services.paths.models_dir / "tiny-set"
    with HubServer() as hub:
        files = _repo(tiny_k3)
        hub.add_repo(REPO, files)
        parts = tuple(name for name in files if name.startswith("IQ1_S/"))
        options = DownloadOptions(endpoint=hub.endpoint, margin_bytes=0, direct_io=False)
        DownloadJob(DownloadRequest(REPO, parts), folder, options).run()  # no projector
        assert not (folder / MMPROJ).exists()
        shard = folder / sorted(parts)[0]
        args = ("-m", str(shard), "-c", "4096", "--jinja", "-ngl", "0")
        spec = LaunchSpec(llama_server, args, ready_timeout=60)
        ctx.engine.launch(LaunchRequest(spec, model_name="tiny", vision=False, shard=shard))
        qtbot.waitUntil(lambda: ctx.engine.ready, timeout=60_000)
        page = ChatPage(ctx)
        qtbot.addWidget(page)
        page.show()
        page.composer.files_added.emit([str(png_file(tmp_path / "x.png"))])
        qtbot.waitUntil(lambda: page.composer.action.isVisible(), timeout=10_000)
        assert "no vision" in page.composer.notice.text()
        assert page.composer.action.text() == "Download the projector"
        ctx.downloads.endpoint = hub.endpoint
        qtbot.mouseClick(page.composer.action, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(
            lambda: (
                ctx.downloads.state is not None and ctx.downloads.state.status in ("done", "failed")
            ),
            timeout=60_000,
        )
        assert ctx.downloads.state.status == "done", ctx.downloads.state.error
    assert (folder / MMPROJ).read_bytes() == files[MMPROJ]
    assert _landed(folder) == set(parts) | {MMPROJ}  # the projector alone came
    assert "launch the model again" in page.composer.notice.text()


def test_download_and_run_a_tier_keeps_the_tier_chosen_on_the_models_page(  # type: ignore[no-untyped-def]
    window, qtbot, hardware_file
) -> None:
    ctx = window.ctx
    ctx.hardware.load_file(hardware_file("1xH200-141GB"))
    window.show_page(PageKey.MODELS)
    page = window.models_page()
    qtbot.waitUntil(lambda: ctx.hardware.judgement is not None, timeout=60_000)
    qtbot.waitUntil(lambda: page.table.rowCount() > 0, timeout=60_000)
    recommended = ctx.hardware.judgement.chosen
    other = next(r for r in page.table.rows if r.tier.id != recommended.tier.id)
    page.table.select_tier(other.tier.id)
    button = page.findChild(QPushButton, "openWizard")
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    wiz = window.wizard
    assert wiz is not None
    wiz.next()
    assert wiz.current_key() == "tiers"
    qtbot.waitUntil(lambda: wiz.selected_tier() is not None, timeout=30_000)
    assert wiz.selected_tier().tier.id == other.tier.id  # not the recommended one
