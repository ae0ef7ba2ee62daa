"""Desktop app benchmarks: cold start, idle memory, a 10,000-message conversation, a fast stream.

    python bench/gui.py [--json]

Goals: cold start to the first window <= 1.0 s; idle RSS <= 250 MB; opening a
10,000-message conversation <= 0.3 s; a stream of >= 500 tok/s rendered with a
median frame <= 16 ms.  Runs offscreen (QT_QPA_PLATFORM=offscreen) in a
throw-away K3DESK_HOME.

- cold start: ``python -m k3desk --gui --no-wizard`` as a new process; wall time
  from spawn to the automation hook's "ready" line (the window is shown), and the
  app's own figure from ``run_gui`` entry to ready;
- idle RSS: that process's VmRSS two seconds after ready;
- open: a conversation of 10,000 messages written with the core HistoryStore,
  timed from the click in the list to the message view laid out;
- stream: a worker thread pushes tokens as fast as it can (or at --rate) through
  the same StreamBuffer -> MessageView path the chat uses; reports tokens/s shown
  and the time each UI update takes (median, p95), plus the event loop's lag.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOALS = {
    "cold_start_s": 1.0,
    "idle_rss_mb": 250.0,
    "open_10k_s": 0.3,
    "stream_tps": 500.0,
    "stream_median_frame_ms": 16.0,
}


def cold_start(home: Path) -> dict[str, float]:
    env = {
        **os.environ,
        "K3DESK_HOME": str(home),
        "K3DESK_AUTOMATION": "1",
        "QT_QPA_PLATFORM": "offscreen",
        "PYTHONPATH": str(REPO),
    }
    # a settings file so the wizard does not open (steady-state start)
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "settings.json").write_text(json.dumps({"wizard_done": True}))
    runs = []
    rss = 0.0
    for i in range(3):
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "k3desk", "--gui", "--no-wizard"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=REPO,
        )
        assert proc.stdout is not None
        assert proc.stdin is not None
        ready: dict[str, Any] = {}
        for line in proc.stdout:
            if line.startswith("{"):
                ready = json.loads(line)
                break
        wall = time.perf_counter() - t0
        if i == 2:
            time.sleep(2.0)
            status = Path(f"/proc/{proc.pid}/status").read_text()
            rss = (
                int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS")).split()[1])
                / 1024
            )
        proc.stdin.write('{"cmd": "quit"}\n')
        proc.stdin.flush()
        proc.wait(timeout=30)
        proc.stdin.close()
        proc.stdout.close()
        runs.append((wall, float(ready.get("startup_s", 0.0))))
    walls = sorted(r[0] for r in runs)
    apps = sorted(r[1] for r in runs)
    return {
        "cold_start_s": walls[len(walls) // 2],
        "app_start_s": apps[len(apps) // 2],
        "idle_rss_mb": rss,
    }


def in_process(home: Path, rate: float) -> dict[str, float]:
    os.environ["K3DESK_HOME"] = str(home / "inproc")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QElapsedTimer, QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from k3desk.core.app.services import Services
    from k3desk.core.chat.history import HistoryStore
    from k3desk.ui.bridge import StreamBuffer
    from k3desk.ui.chat.page import ChatPage
    from k3desk.ui.chat.view import MessageView, MessageVM
    from k3desk.ui.main import create_context

    app = QApplication.instance() or QApplication([sys.argv[0]])
    services = Services()
    services.paths.ensure()
    ctx = create_context(services, app)  # type: ignore[arg-type]
    ctx.reporter.show_dialogs = False

    def spin(ms: int) -> None:
        loop = QEventLoop()
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    # ---- a 10,000-message conversation
    store = HistoryStore(services.paths.history_db)
    conv = store.create_conversation("Ten thousand messages")
    body = (
        "Here is some **Markdown** with `code` and a list:\n\n- one\n- two\n\n"
        "```python\nprint('hello')\n```\n"
    )
    with store.batch():
        for i in range(10_000):
            role = "user" if i % 2 == 0 else "assistant"
            store.add_message(conv.id, role, f"Message {i}. " + (body if i % 5 == 0 else "Short."))
    store.close()
    page = ChatPage(ctx)
    page.resize(1280, 800)
    page.show()
    spin(200)
    while page.list.count() == 0:
        spin(20)
    opened: list[float] = []
    page.chat.opened.connect(lambda _s: opened.append(time.perf_counter()))
    times = []
    for _ in range(3):
        page.list.clearSelection()
        page.list.setCurrentRow(-1)
        page.view.set_messages([])
        opened.clear()
        t0 = time.perf_counter()
        page.list.setCurrentRow(0)
        while not opened:
            app.processEvents()
        app.processEvents()  # lay out what was set
        times.append(time.perf_counter() - t0)
    n_shown = len(page.view.messages())
    open_s = statistics.median(times)
    page.closing()

    # ---- a fast stream through StreamBuffer -> MessageView
    view = MessageView()
    view.resize(1000, 700)
    view.show()
    view.set_messages(
        [MessageVM(str(i), "user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(40)]
    )
    buf = StreamBuffer(hz=30)
    vm = MessageVM("stream", "assistant", streaming=True)
    view.begin_stream(vm)
    frames: list[float] = []
    tokens_shown = [0]

    def on_batch(batch: dict[str, Any]) -> None:
        t = QElapsedTimer()
        t.start()
        vm.content += batch.get("content", "")
        tokens_shown[0] += int(batch["#pieces"])
        view.update_stream(vm)
        frames.append(t.nsecsElapsed() / 1e6)

    buf.batch.connect(on_batch)
    sentence = "The planner keeps attention on the GPUs and moves expert layers to RAM; "
    words = sentence.split(" ")
    n_tokens = 6000
    done = threading.Event()

    def produce() -> None:
        interval = 1.0 / rate if rate > 0 else 0.0
        start = time.perf_counter()
        for i in range(n_tokens):
            piece = words[i % len(words)] + " "
            if i % 400 == 399:
                piece += "\n\n```python\nx = 1\n```\n\n"
            buf.append("content", piece)
            if interval:
                target = start + (i + 1) * interval
                delay = target - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
        done.set()

    lags: list[float] = []
    tick = QTimer()
    tick.setInterval(10)
    last = [time.perf_counter()]

    def on_tick() -> None:
        now = time.perf_counter()
        lags.append((now - last[0]) * 1000 - 10)
        last[0] = now

    tick.timeout.connect(on_tick)
    tick.start()
    t0 = time.perf_counter()
    producer = threading.Thread(target=produce)
    producer.start()
    while not done.is_set() or tokens_shown[0] < n_tokens:
        app.processEvents()
        if done.is_set():
            buf.flush()
    elapsed = time.perf_counter() - t0
    tick.stop()
    producer.join()
    frames.sort()
    ctx.close()
    ctx.tasks.shutdown()
    return {
        "open_10k_s": open_s,
        "open_10k_shown": float(n_shown),
        "stream_tps": n_tokens / elapsed,
        "stream_frames": float(len(frames)),
        "stream_median_frame_ms": statistics.median(frames),
        "stream_p95_frame_ms": frames[int(len(frames) * 0.95) - 1],
        "stream_max_loop_lag_ms": max(lags) if lags else 0.0,
        "stream_chars": float(len(vm.content)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description="k3desk GUI benchmarks")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument(
        "--rate",
        type=float,
        default=1000.0,
        help="tokens per second the fake stream produces (0 = as fast as it can)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="k3bench-") as tmp:
        home = Path(tmp)
        results = cold_start(home / "cold")
        results.update(in_process(home, args.rate))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    rows = [
        ("cold start to first window (wall, median of 3)", "cold_start_s", "s", "<="),
        ("  of which inside run_gui", "app_start_s", "s", ""),
        ("idle RSS", "idle_rss_mb", "MB", "<="),
        ("open a 10,000-message conversation", "open_10k_s", "s", "<="),
        ("fast stream: tokens shown per second", "stream_tps", "tok/s", ">="),
        ("fast stream: median UI update", "stream_median_frame_ms", "ms", "<="),
        ("fast stream: p95 UI update", "stream_p95_frame_ms", "ms", ""),
        ("fast stream: worst event-loop lag", "stream_max_loop_lag_ms", "ms", ""),
    ]
    for label, key, unit, op in rows:
        value = results[key]
        goal = GOALS.get(key)
        verdict = ""
        if goal is not None:
            ok = value <= goal if op == "<=" else value >= goal
            verdict = f"  goal {op} {goal:g} {unit}: {'ok' if ok else 'MISSED'}"
        print(f"{label:48s} {value:10.3f} {unit}{verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
