"""A lone file in ranges: quarter windows at its end vs one window size throughout.

    python bench/ranges_tail.py [--mib 256] [--gbit 10] [--rounds 3]

One file from the Hub stand-in (tests/hubserver.py) on a paced link, alone in its
download, so that it comes in ``ranges_per_file`` windows at once (the last file of
every download does).  Alternating in one process: k3desk as it is (the file's last
windows' worth in windows a quarter the size, ``transfer._grid``) and the anchor, the
earlier rule, one window size to the end (``_grid`` given the window as its tail).
Per round: the rate from the ``preflight`` event to ``done``, and the seconds from the
file's last byte (the last window's end) to its ``verified`` event: the hash still to
do once every byte is in.  Goal: the quarter windows take less time after the last
byte and no less rate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from k3desk.core.hub import transfer  # noqa: E402 - needs the repo on sys.path
from k3desk.core.hub.job import DownloadJob  # noqa: E402
from k3desk.core.hub.model import DownloadEvent, DownloadOptions, DownloadRequest  # noqa: E402
from tests.hubserver import HubServer  # noqa: E402

MiB = 1 << 20
GRID = transfer._grid
FETCH = transfer._Ranges.fetch
last_byte = [0.0]


def uniform(start: int, size: int, window: int, tail: int, count: int) -> Iterator[tuple[int, int]]:
    """The anchor: one window size to the end of the file."""
    return GRID(start, size, window, window, count)


def fetch(self: transfer._Ranges, sink: object, a: int, b: int) -> None:
    FETCH(self, sink, a, b)  # type: ignore[arg-type]
    last_byte[0] = max(last_byte[0], time.perf_counter())


def one_round(hub: HubServer, work: Path, mib: int) -> tuple[float, float]:
    """(MiB/s from preflight to done, seconds from the last byte to verified)."""
    seen: dict[str, float] = {}

    def on_event(e: DownloadEvent) -> None:
        seen.setdefault(e.kind, time.perf_counter())

    last_byte[0] = 0.0
    opts = DownloadOptions(
        endpoint=hub.endpoint, parallel=1, margin_bytes=0, use_hf_cache=False, ranges_per_file=4
    )
    DownloadJob(DownloadRequest("bench/lone", ("lone.gguf",)), work, opts, on_event=on_event).run()
    os.sync()
    return mib / (seen["done"] - seen["preflight"]), seen["verified"] - last_byte[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="size of the file")
    ap.add_argument("--gbit", type=float, default=10.0, help="the link, Gbit/s")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    transfer._Ranges.fetch = fetch  # type: ignore[method-assign]
    rates: dict[str, list[float]] = {"quarter": [], "uniform": []}
    after: dict[str, list[float]] = {"quarter": [], "uniform": []}
    with tempfile.TemporaryDirectory(prefix="k3bench-") as tmp:
        src = Path(tmp) / "lone.gguf"
        with src.open("wb") as f:
            for i in range(args.mib):
                f.write(os.urandom(32) + bytes([i % 251]) * (MiB - 32))
        os.sync()
        with HubServer() as hub:
            hub.add_repo("bench/lone", {"lone.gguf": src})
            hub.link_bps = int(args.gbit * 125_000_000)
            print(f"one file of {args.mib} MiB, 4 windows at once, {args.gbit:g} Gbit/s link")
            for rnd in range(args.rounds):
                order = ["quarter", "uniform"] if rnd % 2 == 0 else ["uniform", "quarter"]
                for rule in order:
                    transfer._grid = GRID if rule == "quarter" else uniform
                    rate, tail = one_round(hub, Path(tmp) / f"{rule}-{rnd}", args.mib)
                    rates[rule].append(rate)
                    after[rule].append(tail)
                    print(
                        f"  round {rnd + 1}: {rule:7s} {rate:5.0f} MiB/s, "
                        f"hash {tail:.3f} s after the last byte"
                    )
    q, u = (statistics.median(rates[k]) for k in ("quarter", "uniform"))
    qa, ua = (statistics.median(after[k]) for k in ("quarter", "uniform"))
    print(
        f"median: quarter windows {q:.0f} MiB/s, {qa:.3f} s after the last byte; uniform "
        f"{u:.0f} MiB/s, {ua:.3f} s; rate ratio {q / u:.2f}, time after the last byte {qa / ua:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
