"""Save screenshots of the app: the wizard (one machine, a cluster), Engine, Models, Cluster, chat.

The chat shows an image and reasoning, and an answer with a table, a nested list
holding code and a task list.

    python scripts/screenshots.py [--out docs/screenshots] [--hardware FILE]

Runs the real app on a real X display: under ``xvfb-run`` or any $DISPLAY; without
one it starts ``Xvfb :87`` itself at 1366x768 (``--screen``) with openbox as the window
manager (apt-get install xvfb openbox libxcb-cursor0 ...), and the windows open at the
size the app picks for that screen.  It
uses a throw-away K3DESK_HOME, the tiny Kimi-K3 served by the real llama-server
for the chat and engine pictures, and the local Hub stand-in from the test suite
for the download page.  The chat's text is written into the history directly (the
tiny model's random weights only produce gibberish); everything else is live.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHAT_QUESTION = "What is on this chart, and which tier should I pick for 8x H100?"
CHAT_REASONING = (
    "The picture shows two bars: the tier's VRAM need against the machine's VRAM.\n"
    "With 8x H100 (640 GB VRAM) and 2 TB RAM, the planner keeps attention on the GPUs "
    "and moves the experts of some layers to RAM. Q3_K_S fits as a hybrid."
)
CHAT_ANSWER = """The chart compares **what each tier needs** with **what your machine has**:

- the violet bar is VRAM, the teal one RAM, the amber one disk;
- a bar drawn in red means the tier does not fit on that resource.

For 8x H100 + 2 TB RAM the best fit is **Q3_K_S (AtomicChat)** as a *hybrid* plan:

| Tier | Verdict | Expected speed |
|---|---|---|
| Q3_K_S | hybrid, 45 expert layers on CPU | ~13 tok/s |
| IQ1_S (GrEarl) | everything on the GPUs | ~26 tok/s |

To start it from a terminal:

```bash
k3desk serve models/atomicchat-q3ks/Kimi-K3-Q3_K_S-00001-of-00027.gguf --ctx 8192
```
"""


MARKDOWN_QUESTION = "How do I start Q3_K_S on two machines, and what is left to do?"
MARKDOWN_ANSWER = """1. On **each** machine, build llama.cpp with RPC:

   ```bash
   cmake -B build -DGGML_RPC=ON -DGGML_CUDA=ON
   cmake --build build -j
   ```

2. Then start the servers:
   - on the second machine, the RPC worker:

     ```bash
     rpc-server --host 10.0.0.12 --port 50052
     ```

   - on the first, `llama-server` with `--rpc 10.0.0.12:50052`.

| Step | Where | Time |
|---|---|--:|
| build (`cmake`) | both | ~7 min |
| copy shards | first | ~40 min |

Still to do:

- [x] download the 27 shards
- [x] verify every SHA-256
- [ ] open port `50052` between the two
- [ ] launch and ask a first question
"""


def ensure_display(screen: str) -> list[subprocess.Popen[bytes]]:
    """An X display of ``screen`` (e.g. 1366x768) with a window manager on it (openbox,
    when installed: apt-get install openbox), unless $DISPLAY names one already."""
    if os.environ.get("DISPLAY"):
        return []
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        sys.exit("No $DISPLAY and no Xvfb: apt-get install xvfb (see the module docstring).")
    procs = [subprocess.Popen([xvfb, ":87", "-screen", "0", f"{screen}x24", "-nolisten", "tcp"])]
    os.environ["DISPLAY"] = ":87"
    time.sleep(1.0)
    wm = shutil.which("openbox")
    if wm is not None:  # windows placed and framed as on a desktop
        procs.append(subprocess.Popen([wm], stderr=subprocess.DEVNULL))
        time.sleep(0.5)
    return procs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    ap.add_argument("--hardware", type=Path, default=REPO / "resources/hardware/8xH100-2TB.json")
    ap.add_argument("--theme", default="light", choices=("light", "dark", "system"))
    ap.add_argument("--screen", default="1366x768", help="the X screen's size (no $DISPLAY)")
    args = ap.parse_args()
    display = ensure_display(args.screen)
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb")
    home = Path(tempfile.mkdtemp(prefix="k3shots-"))
    os.environ["K3DESK_HOME"] = str(home)
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    try:
        return shoot(args, home)
    finally:
        for proc in reversed(display):
            proc.terminate()
        shutil.rmtree(home, ignore_errors=True)


def shoot(args: argparse.Namespace, home: Path) -> int:
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtGui import QColor, QImage, QPainter
    from PySide6.QtWidgets import QApplication, QScrollArea, QWidget

    from k3desk.core.app.services import Services
    from k3desk.core.chat.history import HistoryStore
    from k3desk.core.chat.images import prepare_image
    from k3desk.core.chat.model import Timings, Usage
    from k3desk.core.engines.discovery import find_llama_server
    from k3desk.core.engines.supervisor import LaunchSpec
    from k3desk.core.settings import Settings
    from k3desk.devtools.tinyk3 import write_tiny_k3
    from k3desk.ui.chat.composer import image_to_png
    from k3desk.ui.chat.controller import Figures
    from k3desk.ui.engine.controller import LaunchRequest
    from k3desk.ui.main import build_window, create_context, parse_args

    app = QApplication([sys.argv[0]])
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    services = Services()
    services.paths.ensure()
    ctx = create_context(services, app)
    ctx.save_settings(Settings(theme=args.theme, wizard_done=True, download_workers=3))
    ctx.reporter.show_dialogs = False

    def wait(ms: int) -> None:
        loop = QEventLoop()
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    def until(cond: object, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while not cond() and time.monotonic() < end:  # type: ignore[operator]
            wait(50)

    def save(widget: QWidget, name: str) -> None:
        wait(300)
        path = out / name
        widget.grab().save(str(path))
        print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)

    window = build_window(ctx, parse_args(["--hardware", str(args.hardware)]))
    window.show()  # the size it opens at on this screen

    # ---- wizard
    wiz = window.open_wizard()
    hw = ctx.hardware
    until(lambda: hw.recommendation is not None)
    save(wiz, "wizard-1-machine.png")
    wiz.next()
    save(wiz, "wizard-2-tiers.png")
    wiz.tiers.table.select_tier(hw.recommendation.best.tier.id)
    wiz.next()
    until(lambda: bool(wiz.where.free.text()))
    save(wiz, "wizard-3-where.png")

    # download from the local Hub stand-in, paused part-way
    from tests.fixtures.hub import TIER_PATTERNS, manifest_for, tier_files
    from tests.hubserver import HubServer

    with HubServer() as hub:
        files = tier_files(shard_size=3_000_000)
        files["manifest.json"] = manifest_for(files)
        hub.add_repo("tester/Kimi-K3-Tiny-GGUF", files)
        hub.throttle_bps = 6_000_000
        from k3desk.core.hub.model import DownloadRequest

        dl = ctx.downloads
        dl.endpoint = hub.endpoint
        wiz.next()
        req = DownloadRequest(
            repo="tester/Kimi-K3-Tiny-GGUF", allow_patterns=TIER_PATTERNS, label="tiny-iq1s"
        )
        dl.start(req, home / "models" / "tiny")
        until(lambda: dl.state is not None and dl.state.fraction > 0.45)
        save(wiz, "wizard-4-download.png")
        dl.pause()
        until(lambda: not dl.running)

    # engine: the tiny model with its projector, served by the real llama-server
    model = write_tiny_k3(home / "tiny", shards=3, mmproj=True)
    wiz.next()
    wiz.engine.panel.shard.setText(str(model.first_part))
    wiz.engine.panel.mmproj.setText(str(model.mmproj))
    until(lambda: bool(wiz.engine.panel.rows), 120)
    save(wiz, "wizard-5-engine.png")
    wiz.reject()

    exe = find_llama_server(services.paths)
    engine = ctx.engine
    if exe is not None:
        spec = LaunchSpec(
            exe,
            (
                "-m",
                str(model.first_part),
                "--mmproj",
                str(model.mmproj),
                "-c",
                "4096",
                "--jinja",
                "-ngl",
                "0",
            ),
            ready_timeout=60,
        )
        engine.launch(LaunchRequest(spec, model_name=model.name, vision=True))
        until(lambda: engine.ready, 60)
    window.show_page("engine")
    page = window.engine_page()
    page.tabs.setCurrentIndex(1)
    save(window, "engine.png")
    # My models: the tiny model and its projector, and a sparse twin of a published tier
    # (its real headers, no weights) under a name of its own, recognised from its headers
    from k3desk.core.app.library import add_model
    from k3desk.devtools.twin import write_twin

    add_model(services, model.first_part)
    twin = write_twin(services.catalog.get("grearl-iq1s"), home / "my-kimi")
    for i, part in enumerate(twin, 1):
        part.rename(part.with_name(f"my-kimi-{i:05d}-of-{len(twin):05d}.gguf"))
    add_model(services, twin[0].parent)
    window.show_page("models")
    mine = window.models_page().mine
    mine.refresh()
    until(lambda: window.models_page().table.rowCount() > 0 and len(mine.rows()) == 2)
    mine.select(str(model.first_part))
    save(window, "models.png")

    # On the Hub: the stand-in serving twins of three published tiers in two repositories
    # and the tiny set, every set judged from its real headers (read by ranges)
    with HubServer() as hub:
        for repo, tiers in (
            ("6block/Kimi-K3-GGUF", ("6block-iq1s-xs", "6block-iq1s-xxs-832e")),
            ("GrEarl/Kimi-K3-GGUF-IQ1_S", ("grearl-iq1s",)),
        ):
            parts = [p for t in tiers for p in write_twin(services.catalog.get(t), home / t)]
            hub.add_repo(repo, {p.name: p for p in parts}, hash_content=False)
        hub.add_repo(
            "tester/Kimi-K3-Tiny-GGUF", {f"IQ1_S/{p.name}": p.read_bytes() for p in model.parts}
        )
        on_hub = window.models_page().hub
        window.models_page().sources.setCurrentWidget(on_hub)
        on_hub.endpoint = hub.endpoint
        on_hub.search()
        until(lambda: on_hub.result is not None, 180)
        # the wizard's tiers step with the same Hub: its sets below the catalog's tiers,
        # the GrEarl set chosen (judged from its real headers, with the card's facts)
        os.environ["HF_ENDPOINT"] = hub.endpoint
        wiz = window.open_wizard()
        wiz.next()
        until(lambda: wiz.tiers.hub.result is not None and not wiz.tiers.hub.searching, 180)
        wiz.tiers.hub.select_set("GrEarl/Kimi-K3-GGUF-IQ1_S", "Kimi-K3-IQ1_S")
        save(wiz, "wizard-2-hub.png")
        wiz.reject()
        os.environ.pop("HF_ENDPOINT")
    on_hub.table.scrollToTop()
    on_hub.table.selectRow(2)  # the 94-part set: its judgement in full, and its download
    save(window.models_page(), "models-hub.png")
    window.models_page().sources.setCurrentIndex(0)

    # cluster: three DGX Sparks (GB10); no such machines here, so their probe reports are
    # built from the shipped GB10 hardware file, as the tests do
    from k3desk.core.cluster.nodes import Cluster, Node
    from k3desk.ui.cluster.controller import ProbeRun
    from tests.core.cluster.reports import report

    clusters = ctx.cluster
    sparks = Cluster(
        "sparks",
        tuple(
            Node(host=f"spark{i}", user="alice", address=f"10.0.0.{10 + i}",
                 model_path="/models/k3")
            for i in (1, 2, 3)
        ),
    )  # fmt: skip
    clusters.save_cluster(sparks)
    reports = tuple(report(n) for n in sparks.nodes)
    clusters.probes["sparks"] = ProbeRun("vcruz305-ud-iq1s", reports, time.time())
    window.show_page("cluster")
    window.cluster_page().reload(select="sparks")
    save(window, "cluster.png")

    # Settings > Local API: two keys made for tools, two requests at once, the network opened
    from k3desk.core.app.local_api import create_key
    from k3desk.ui.settings_page import SettingsPage

    for name in ("vscode", "my-agent"):
        create_key(services, name)
    ctx.update_settings(api_parallel=2, api_lan=True, api_cors_origin="http://10.0.0.5:3000")
    window.show_page("settings")
    settings_page = window.findChild(SettingsPage)
    settings_page.api.refresh()
    until(lambda: settings_page.api.keys.count() == 2)
    settings_page.findChild(QScrollArea).ensureWidgetVisible(settings_page.api, 0, 0)
    save(window, "settings-local-api.png")
    ctx.update_settings(api_lan=False, api_cors_origin="")

    # the wizard with several machines: its cluster step, then every tier judged for them
    wiz = window.open_wizard()
    until(lambda: wiz.machine.isComplete())
    wiz.machine.several.click()
    wiz.next()
    wiz.cluster.view.reload(select="sparks")
    save(wiz, "wizard-cluster.png")
    wiz.next()
    save(wiz, "wizard-cluster-tiers.png")
    wiz.reject()

    # chat with an image and reasoning
    store = HistoryStore(services.paths.history_db)
    chart = QImage(320, 200, QImage.Format.Format_RGB32)
    chart.fill(QColor("#ffffff"))
    p = QPainter(chart)
    for i, (need, color) in enumerate(((0.72, "#7c3aed"), (0.55, "#0d9488"), (0.9, "#d97706"))):
        p.fillRect(20, 30 + i * 55, 280, 30, QColor("#e5e7eb"))
        p.fillRect(20, 30 + i * 55, int(280 * need), 30, QColor(color))
    p.end()
    img = prepare_image(image_to_png(chart), name="fit-chart.png")
    conv = store.create_conversation("Which tier for 8x H100?")
    store.create_conversation("Summarise the K3 model cards")
    store.create_conversation("Explain --n-cpu-moe")
    conv_id = conv.id
    store.add_message(conv_id, "user", CHAT_QUESTION, images=[img])
    store.add_message(
        conv_id,
        "assistant",
        CHAT_ANSWER,
        reasoning=CHAT_REASONING,
        usage=Usage(412, 268, 680),
        timings=Timings(412, 350.0, 268, 19800.0, 13.5),
    )
    store.close()
    window.show_page("chat")
    chat = window.chat_page()
    chat.chat.refresh_list()
    until(lambda: chat.list.count() >= 3)
    for i in range(chat.list.count()):
        if chat.list.item(i).data(256) == conv_id:
            chat.list.setCurrentRow(i)
    until(lambda: len(chat.view.messages()) == 2)
    chat.chat.figures = Figures(Timings(412, 350.0, 268, 19800.0, 13.5), (680, 8192))
    chat._update_status()
    answer = chat.view.messages()[-1]
    chat.view.toggle_reasoning(answer.id)
    chat.view.verticalScrollBar().setValue(0)
    save(window, "chat.png")

    # chat: an answer with a nested list holding code, a table and a task list
    store = HistoryStore(services.paths.history_db)
    md_conv = store.create_conversation("Two machines over RPC")
    store.add_message(md_conv.id, "user", MARKDOWN_QUESTION)
    store.add_message(
        md_conv.id,
        "assistant",
        MARKDOWN_ANSWER,
        usage=Usage(96, 310, 406),
        timings=Timings(96, 80.0, 310, 23000.0, 13.5),
    )
    store.close()
    chat.chat.refresh_list()
    until(lambda: chat.list.count() >= 4)
    for i in range(chat.list.count()):
        if chat.list.item(i).data(256) == md_conv.id:
            chat.list.setCurrentRow(i)
    until(lambda: len(chat.view.messages()) == 2 and chat.view.messages()[0].role == "user"
          and chat.view.messages()[0].content == MARKDOWN_QUESTION)  # fmt: skip
    chat.view.verticalScrollBar().setValue(0)
    save(window, "chat-markdown.png")

    # the chat at 1024x700 (the smallest common laptop screen), in both themes
    for i in range(chat.list.count()):
        if chat.list.item(i).data(256) == conv_id:
            chat.list.setCurrentRow(i)
    until(lambda: chat.view.messages() and chat.view.messages()[0].content == CHAT_QUESTION)
    chat.chat.figures = Figures(Timings(412, 350.0, 268, 19800.0, 13.5), (680, 8192))
    chat._update_status()
    window.resize(1024, 700)
    theme_manager = ctx.theme
    assert theme_manager is not None
    for name in ("light", "dark"):
        theme_manager.apply(name)
        wait(200)
        chat.view.verticalScrollBar().setValue(0)
        save(window, f"chat-1024x700-{name}.png")
    theme_manager.apply(args.theme)
    window.show_page("models")
    save(window, "models-1024x700.png")

    engine.close()
    ctx.close()
    ctx.tasks.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
