"""Does a disk that is slow, but not slower than the link, hold k3desk's download back?

    sudo python bench/download_slow_disk.py [--gbit 1] [--limits 0,160,125] [--shard-mib 1024]

k3desk writes each buffer on the thread that received it (``core/hub/transfer.py``),
so a write that waits could leave the link idle.  This runs ``DownloadJob`` (nine
shards from the Hub stand-in, paced to ``--gbit``) once per entry of ``--limits``:
the writes of this process held to that many MiB/s by the kernel's block throttle
(cgroup v2 ``io.max`` or v1 ``blkio.throttle.write_bps_device``; 0 = not held).
Each run prints its rate as a share of the link (the anchor, paced by the stand-in
in the same run) and how long the writes waited (p50/p99/max of ``Sink.pwrite``).

Needs root (it makes a cgroup and moves itself into it) and a work folder on a
block device (not a tmpfs).  Measured 2026-12-03 on the 2-core VM: see docs/measured.md,
"Downloads: where the time goes".
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from download import PATTERN, REPO_ID, Busy, make_shards  # noqa: E402 - the bench's own

from k3desk.core.hub import diskio  # noqa: E402 - needs the repo on sys.path
from k3desk.core.hub.job import DownloadJob  # noqa: E402
from k3desk.core.hub.model import DownloadOptions, DownloadRequest  # noqa: E402
from tests.hubserver import HubServer  # noqa: E402

MiB = 1 << 20


def block_device(folder: Path) -> str:
    """``major:minor`` of the whole disk under ``folder`` (a partition's parent)."""
    st = os.stat(folder)
    sys_dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not sys_dev.exists():
        sys.exit(f"{folder} is not on a block device (a tmpfs?): choose another with --work")
    real = sys_dev.resolve()
    if (real / "partition").exists():
        real = real.parent
    return (real / "dev").read_text().strip()


class Throttle:
    """This process's writes to one disk held to a rate, in a cgroup of its own."""

    def __init__(self, device: str) -> None:
        self.device = device
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if v2.exists() and "io" in v2.read_text().split():
            self.root, self.knob = Path("/sys/fs/cgroup"), "io.max"
        elif Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device").exists():
            self.root, self.knob = Path("/sys/fs/cgroup/blkio"), "blkio.throttle.write_bps_device"
        else:
            sys.exit("no block throttle here (cgroup v2 io or v1 blkio): nothing to measure")
        self.group = self.root / f"k3desk-bench-{os.getpid()}"
        try:
            self.group.mkdir()
            (self.group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as exc:
            sys.exit(f"cannot make a cgroup under {self.root} ({exc.strerror}): run as root")

    def limit(self, mib_s: int) -> None:
        if self.knob == "io.max":
            value = f"{self.device} wbps={mib_s * MiB if mib_s else 'max'}"
        else:
            value = f"{self.device} {mib_s * MiB}"  # 0 lifts the limit
        (self.group / self.knob).write_text(value)

    def close(self) -> None:
        self.limit(0)
        (self.root / "cgroup.procs").write_text(str(os.getpid()))
        self.group.rmdir()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gbit", type=float, default=1.0, help="the link, Gbit/s")
    ap.add_argument("--limits", default="0,160,125", help="MiB/s of writes per run, 0 = none")
    ap.add_argument("--shard-mib", type=int, default=1024)
    ap.add_argument("--work", type=Path, help="folder on the disk to test (default: temp)")
    args = ap.parse_args()
    limits = [int(x) for x in args.limits.split(",")]
    need = 2 * 9 * args.shard_mib * MiB
    free = shutil.disk_usage(args.work or tempfile.gettempdir()).free
    if free < need * 1.05:
        sys.exit(
            f"the work folder has {free / 2**30:.1f} GiB free; this run needs about "
            f"{need / 2**30:.1f} GiB (choose another with --work, or smaller --shard-mib)"
        )
    throttle = Throttle(block_device(args.work or Path(tempfile.gettempdir())))
    work = Path(tempfile.mkdtemp(prefix="k3slow-", dir=args.work))
    waits: list[float] = []
    write = diskio.Sink.pwrite

    def timed(self: diskio.Sink, data: memoryview, at: int) -> None:
        t = time.perf_counter()
        write(self, data, at)
        waits.append(time.perf_counter() - t)

    diskio.Sink.pwrite = timed  # type: ignore[method-assign]
    try:
        files = make_shards(work / "served", args.shard_mib)
        os.sync()
        total = sum(p.stat().st_size for n, p in files.items() if n.endswith(".gguf"))
        busy = Busy(work)
        with HubServer() as hub:
            hub.add_repo(REPO_ID, dict(files.items()))
            hub.link_bps = int(args.gbit * 125e6)
            link = hub.link_bps / MiB
            print(f"9 shards x {args.shard_mib} MiB over a {args.gbit:g} Gbit/s link "
                  f"({link:.0f} MiB/s); writes held per run to: {args.limits} MiB/s")  # fmt: skip
            for mib_s in limits:
                throttle.limit(mib_s)
                waits.clear()
                target = work / f"run-{mib_s}"
                opts = DownloadOptions(endpoint=hub.endpoint, margin_bytes=0, use_hf_cache=False)
                a, t0 = busy.sample(), time.perf_counter()
                DownloadJob(DownloadRequest(REPO_ID, (PATTERN,)), target, opts).run()
                seconds, b = time.perf_counter() - t0, busy.sample()
                ws = sorted(waits)

                def ms(q: float, ws: list[float] = ws) -> float:
                    return ws[min(len(ws) - 1, int(q * len(ws)))] * 1000 if ws else 0.0

                rate = total / MiB / seconds
                held = f"{mib_s} MiB/s ({mib_s / link:.2f}x the link)" if mib_s else "not held"
                print(f"  writes {held}: {rate:.0f} MiB/s = {rate / link:.0%} of the link; "
                      f"writes waited p50 {ms(0.5):.1f} ms, p99 {ms(0.99):.0f} ms, max "
                      f"{ms(1.0):.0f} ms; {busy.describe(a, b)}", flush=True)  # fmt: skip
                shutil.rmtree(target)
                os.sync()
    finally:
        throttle.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
