"""A 20,000-token Markdown answer streamed into the chat view, against plain text.

    python bench/markdown_stream.py [--tokens 20000] [--rate 1000] [--json]

Goal (the GUI's stream goal, bench/gui.py): >= 500 tokens/s shown and a median UI update
<= 16 ms while a long answer streams.  The answer is real-style Markdown (headings,
paragraphs, nested lists with code, tables, quotes, task lists), built from the
rendering corpus's long answers; a worker thread pushes it piece by piece at --rate
through the same StreamBuffer -> MessageView path the chat uses.

Anchor, in the same run: the same pieces streamed as plain text in one block that is
re-inserted whole on each update (what the view did with every answer before it kept
settled blocks in place), so the ratio shows Markdown's cost against Qt's own updates.
Runs offscreen in a throw-away K3DESK_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOALS = {"tps": 500.0, "median_frame_ms": 16.0}


def answer_pieces(n_tokens: int) -> list[str]:
    """About ``n_tokens`` pieces (a word or a run of punctuation/space each, as a
    tokenizer would send them) of long Markdown answers, one after another."""
    from tests.ui.test_markdown_oracle import corpus

    answers = [src for name, src in corpus() if name.startswith("answers_long")]
    pieces: list[str] = []
    i = 0
    while len(pieces) < n_tokens:
        text = answers[i % len(answers)].replace("Kimi-K3", f"Kimi-K3 (part {i})")
        pieces += re.findall(r"\w+|\s+|[^\w\s]+", text + "\n\n")
        i += 1
    return pieces[:n_tokens]


def stream(pieces: list[str], rate: float, markdown: bool) -> dict[str, float]:
    from PySide6.QtCore import QElapsedTimer
    from PySide6.QtWidgets import QApplication

    from k3desk.ui.bridge import StreamBuffer
    from k3desk.ui.chat.view import MessageView, MessageVM

    app = QApplication.instance() or QApplication([sys.argv[0]])
    view = MessageView()
    view.resize(1000, 700)
    view.show()
    if not markdown:
        import html

        class Plain:
            def render(self, src: str, copy_href: Any = None) -> tuple[str, list[str]]:
                return f"<p>{html.escape(src)}</p>", []

            def render_blocks(self, src: str, copy_href: Any = None) -> list[Any]:
                from k3desk.ui.chat.markdown import RenderedBlock

                return [RenderedBlock(("plain", src), f"<p>{html.escape(src)}</p>", ())]

            def set_colors(self, colors: Any) -> None:
                pass

        view.renderer = Plain()  # type: ignore[assignment]
    view.set_messages(
        [MessageVM(str(i), "user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(20)]
    )
    buf = StreamBuffer(hz=30)
    vm = MessageVM("stream", "assistant", streaming=True)
    view.begin_stream(vm)
    frames: list[float] = []
    shown = [0]

    def on_batch(batch: dict[str, Any]) -> None:
        t = QElapsedTimer()
        t.start()
        vm.content += batch.get("content", "")
        shown[0] += int(batch["#pieces"])
        view.update_stream(vm)
        frames.append(t.nsecsElapsed() / 1e6)

    buf.batch.connect(on_batch)
    done = threading.Event()

    def produce() -> None:
        interval = 1.0 / rate if rate > 0 else 0.0
        start = time.perf_counter()
        for i, piece in enumerate(pieces):
            buf.append("content", piece)
            if interval:
                delay = start + (i + 1) * interval - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
        done.set()

    t0 = time.perf_counter()
    producer = threading.Thread(target=produce)
    producer.start()
    while not done.is_set() or shown[0] < len(pieces):
        app.processEvents()
        if done.is_set():
            buf.flush()
    elapsed = time.perf_counter() - t0
    producer.join()
    view.end_stream(vm)
    frames.sort()
    result = {
        "tps": len(pieces) / elapsed,
        "median_frame_ms": statistics.median(frames),
        "p95_frame_ms": frames[int(len(frames) * 0.95) - 1],
        "max_frame_ms": frames[-1],
        "frames": float(len(frames)),
        "chars": float(len(vm.content)),
    }
    view.close()
    view.deleteLater()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=1000.0, help="pieces per second (0 = flat out)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    with tempfile.TemporaryDirectory(prefix="k3bench-") as home:
        os.environ["K3DESK_HOME"] = home
        pieces = answer_pieces(args.tokens)
        plain = stream(pieces, args.rate, markdown=False)
        md = stream(pieces, args.rate, markdown=True)
    ratio = md["median_frame_ms"] / plain["median_frame_ms"] if plain["median_frame_ms"] else 0.0
    if args.json:
        print(json.dumps({"markdown": md, "plain_anchor": plain, "median_ratio": ratio}, indent=2))
        return 0
    print(f"{len(pieces)} tokens, {md['chars']:.0f} characters, offered at {args.rate:g} tok/s")
    for label, r in (("plain text (anchor)", plain), ("Markdown", md)):
        print(
            f"{label:20s} {r['tps']:7.0f} tok/s shown   median {r['median_frame_ms']:6.2f} ms"
            f"   p95 {r['p95_frame_ms']:6.2f} ms   max {r['max_frame_ms']:6.1f} ms"
            f"   ({r['frames']:.0f} updates)"
        )
    ok_tps = md["tps"] >= GOALS["tps"]
    ok_frame = md["median_frame_ms"] <= GOALS["median_frame_ms"]
    print(f"Markdown / plain median update: {ratio:.2f}x")
    print(
        f"goal >= {GOALS['tps']:g} tok/s: {'ok' if ok_tps else 'MISSED'};  "
        f"median update <= {GOALS['median_frame_ms']:g} ms: {'ok' if ok_frame else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
