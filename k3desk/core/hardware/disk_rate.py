"""How fast the disk holding a model reads: the figure every streaming plan rests on.

A model that does not fit in RAM is read from disk twice over: once while it loads
(every shard, front to back) and then, for every token, whatever the page cache
could not keep.  Both times the disk's sustained read rate sets the pace, so a
plan that assumes a fast NVMe drive for a model on a hard disk is wrong by 20x.

The rate comes from, best first:

- ``measured``: reads of the model's own shard with the page cache bypassed
  (``O_DIRECT``; where a file system refuses it, the file's cached pages are
  dropped first with ``posix_fadvise(DONTNEED)``), over its *data* extents only
  (``SEEK_DATA``/``SEEK_HOLE``): a sparse file's holes cost no disk read and would
  time the page allocator, not the disk.  A file that is mostly holes is not
  measured and says so.  Kept per disk in the state folder, so it is measured once.
- ``table``: the kind of device the file lives on, from sysfs (an NVMe drive's PCIe
  link, a SATA SSD, a spinning disk, an SD card).  A virtual disk or a network file
  system has no such figure: its speed is the host's or the network's.
- ``unknown``: the planner's assumption (:data:`ASSUMED_BPS`), and the plan says so.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3desk.core.hardware.profile import Bandwidth
from k3desk.core.localfiles import check_dict, check_float, check_int, check_text, load_checked
from k3desk.core.private import write_private
from k3desk.core.progress import CancelToken
from k3desk.core.units import GB, MiB

REAL_ROOT = Path("/")

# What a plan assumes when nothing is known: a PCIe 3.0 x4 NVMe drive's sequential
# read rate, the common case among the machines the model cards describe.
ASSUMED_BPS = 3.5e9

RATES_FILE = "disk-read-rates.json"
SCHEMA = 1
MAX_FILE_BYTES = 1 * MiB
MAX_DEVICES = 64
# a measurement older than this is taken again (a drive may have been replaced)
MAX_AGE_S = 90 * 86400.0

# a measurement reads at most this much, in this many places, for at most this long
MEASURE_BYTES = 256 * MiB
MEASURE_SPOTS = 8
MEASURE_SECONDS = 3.0
CHUNK = 4 * MiB
ALIGN = 4096
# below this many bytes of data read, the figure says more about latency than rate
MIN_MEASURED = 32 * MiB

# ------------------------------------------------------------------ sysfs table

# Sustained sequential reads as a share of an NVMe drive's PCIe link rate: drives
# reach 80-90 % of the link on large reads; the lower end is taken.
NVME_LINK_SHARE = 0.8
# PCIe payload rate per lane in bytes/s, by the link's transfer rate (GT/s): 8b/10b
# coding up to 5 GT/s, 128b/130b from 8 GT/s on.
_PCIE_LANE_BPS = {
    2.5: 0.25e9,
    5.0: 0.5e9,
    8.0: 0.985e9,
    16.0: 1.969e9,
    32.0: 3.938e9,
    64.0: 7.563e9,
}
SATA_SSD_BPS = 0.53e9  # SATA 6 Gb/s carries about 560 MB/s; drives sustain about 530
HDD_BPS = 0.2e9  # a 7,200 rpm drive's outer tracks; inner tracks are slower
MMC_BPS = 0.09e9  # eMMC / SD cards
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "ceph"})
RAM_FS = frozenset({"tmpfs", "ramfs"})


@dataclass(frozen=True)
class DiskDevice:
    """The block device a path lives on, as sysfs names it."""

    key: str  # "259:0 Samsung SSD 990 PRO 2TB": major:minor of the whole disk + its model
    name: str  # "nvme0n1", "sda", "vda"
    model: str
    rotational: bool | None
    link_bps: float  # an NVMe drive's PCIe link payload rate, 0 when not known


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _block_dir(path: Path, root: Path) -> tuple[Path, str] | None:
    """sysfs's folder of the block device ``path``'s file system is on (a partition
    resolved to its disk) and that device's major:minor."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    link = root / "sys" / "dev" / "block" / f"{major}:{minor}"
    dev_dir = Path(os.path.realpath(link))  # sysfs links are relative: they stay in root
    if not dev_dir.is_dir():
        return None
    if (dev_dir / "partition").exists():
        dev_dir = dev_dir.parent
    return dev_dir, f"{major}:{minor}"


def read_around_bytes(path: Path, root: Path = REAL_ROOT) -> int | None:
    """Bytes a page fault on ``path`` mapped by llama.cpp reads around the missed page:
    twice the device's ``read_ahead_kb`` (llama.cpp sets ``POSIX_FADV_SEQUENTIAL`` on
    every model file, src/llama-mmap.cpp b11434, which doubles the file's window:
    mm/fadvise.c), the window ``do_sync_mmap_readahead`` reads (mm/filemap.c).  None
    where sysfs does not say."""
    found = _block_dir(path, root)
    text = _read(found[0] / "queue" / "read_ahead_kb") if found else None
    if text is None or not text.isdigit():
        return None
    return 2 * int(text) * 1024


def device_of(path: Path, root: Path = REAL_ROOT) -> DiskDevice | None:
    """The whole disk holding ``path`` (its partition's parent), or None when the file
    system has no block device (overlay, tmpfs, network) or sysfs is not there."""
    found = _block_dir(path, root)
    if found is None:
        return None
    dev_dir, majmin = found
    # device mapper, md, bcache: the first disk under it
    slaves = sorted((dev_dir / "slaves").glob("*")) if (dev_dir / "slaves").is_dir() else []
    if slaves:
        inner = Path(os.path.realpath(slaves[0]))
        if inner.is_dir():
            dev_dir = inner.parent if (inner / "partition").exists() else inner
    name = dev_dir.name
    whole = _read(dev_dir / "dev") or majmin
    model = " ".join((_read(dev_dir / "device" / "model") or "").split())
    rot = _read(dev_dir / "queue" / "rotational")
    return DiskDevice(
        key=f"{whole} {model}".strip(),
        name=name,
        model=model,
        rotational=None if rot not in ("0", "1") else rot == "1",
        link_bps=_nvme_link_bps(dev_dir) if name.startswith("nvme") else 0.0,
    )


def _nvme_link_bps(dev_dir: Path) -> float:
    """The PCIe link of an NVMe namespace's controller: '16.0 GT/s PCIe' x '4'."""
    for pci in (dev_dir / "device" / "device", dev_dir / "device"):
        speed = _read(pci / "current_link_speed")
        width = _read(pci / "current_link_width")
        if speed and width:
            m = re.match(r"\s*([\d.]+)\s*GT/s", speed)
            if m and width.isdigit():
                lane = _PCIE_LANE_BPS.get(float(m.group(1)), 0.0)
                return lane * int(width)
    return 0.0


def table_read_rate(path: Path, filesystem: str = "", root: Path = REAL_ROOT) -> Bandwidth:
    """The read rate the kind of device holding ``path`` usually sustains."""
    if filesystem in RAM_FS:
        return Bandwidth(10 * GB, "table", f"{filesystem}: the files are already in RAM")
    if filesystem in NETWORK_FS or filesystem.startswith("fuse"):
        return Bandwidth(0.0, "unknown", f"{filesystem}: a network or user-space file system")
    dev = device_of(path, root)
    if dev is None:
        return Bandwidth(0.0, "unknown", "no block device found for the folder")
    what = f"{dev.name}{' (' + dev.model + ')' if dev.model else ''}"
    if dev.name.startswith("nvme"):
        if dev.link_bps > 0:
            bps = dev.link_bps * NVME_LINK_SHARE
            return Bandwidth(
                float(round(bps)),
                "table",
                f"NVMe {what} on a {dev.link_bps / GB:.1f} GB/s PCIe link: "
                f"{NVME_LINK_SHARE:.0%} of it assumed",
            )
        return Bandwidth(ASSUMED_BPS, "table", f"NVMe {what}, link unknown: PCIe 3.0 x4 assumed")
    if dev.name.startswith(("vd", "xvd")):
        return Bandwidth(0.0, "unknown", f"virtual disk {what}: its speed is the host's")
    if dev.name.startswith("mmcblk"):
        return Bandwidth(MMC_BPS, "table", f"SD card / eMMC {what}")
    if dev.name.startswith(("sd", "hd")) and dev.rotational is not None:
        if dev.rotational:
            return Bandwidth(HDD_BPS, "table", f"spinning disk {what}")
        return Bandwidth(SATA_SSD_BPS, "table", f"SATA SSD {what}")
    return Bandwidth(0.0, "unknown", f"{what}: kind of device not known")


# ------------------------------------------------------------------ measuring


@dataclass(frozen=True)
class Measurement:
    bytes_per_s: float  # 0 when not measured
    bytes_read: int
    seconds: float
    why_not: str = ""  # set when nothing could be timed
    cache_bypassed: str = "O_DIRECT"  # or "fadvise"


def data_extents(fd: int, size: int, limit: int = 4096) -> list[tuple[int, int]]:
    """The (start, end) ranges of ``fd`` that hold data, in order, at most ``limit``
    of them (a file system without SEEK_DATA reports the whole file)."""
    seek_data = getattr(os, "SEEK_DATA", None)
    seek_hole = getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return [(0, size)] if size else []
    out: list[tuple[int, int]] = []
    pos = 0
    try:
        while pos < size and len(out) < limit:
            try:
                start = os.lseek(fd, pos, seek_data)
            except OSError:  # ENXIO: no data past pos
                break
            end = os.lseek(fd, start, seek_hole)
            out.append((start, min(end, size)))
            pos = end
    except OSError:
        return [(0, size)] if size else []
    return out


def _spots(extents: list[tuple[int, int]], budget: int, spots: int) -> list[tuple[int, int]]:
    """``spots`` aligned (offset, length) reads spread evenly over the data extents."""
    total = sum(e - s for s, e in extents)
    if total <= 0:
        return []
    each = max(CHUNK, (min(budget, total) // spots) // ALIGN * ALIGN)
    out: list[tuple[int, int]] = []
    for i in range(spots):
        target = total * i // spots  # this far into the data
        for s, e in extents:
            if target < e - s:
                start = (s + target + ALIGN - 1) // ALIGN * ALIGN
                length = min(each, (e - start) // ALIGN * ALIGN)
                if length >= ALIGN:
                    out.append((start, length))
                break
            target -= e - s
    return out


def _open_uncached(path: Path) -> tuple[int, str]:
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct), "O_DIRECT"
        except OSError:
            pass  # tmpfs and some FUSE file systems refuse O_DIRECT
    fd = os.open(path, flags)
    return fd, "fadvise"


def measure_read_rate(
    path: Path,
    *,
    budget_bytes: int = MEASURE_BYTES,
    budget_s: float = MEASURE_SECONDS,
    cancel: CancelToken | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Time reads of ``path``'s data with the page cache bypassed.

    At most ``budget_bytes`` in :data:`MEASURE_SPOTS` places spread over the file's
    data, stopping after ``budget_s``.  Never raises for an unreadable or sparse file:
    ``why_not`` says why nothing was timed.
    """
    try:
        fd, how = _open_uncached(path)
    except OSError as exc:
        return Measurement(0.0, 0, 0.0, f"{path.name} cannot be opened: {exc.strerror or exc}")
    buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants
    try:
        size = os.fstat(fd).st_size
        extents = data_extents(fd, size)
        data = sum(e - s for s, e in extents)
        if size < MIN_MEASURED:
            why = f"{path.name} is too small to time ({size // MiB} MiB)"
            return Measurement(0.0, 0, 0.0, why)
        if data < MIN_MEASURED or data < size // 4:
            why = f"{path.name} is mostly holes (a sparse file): no disk reads to time"
            return Measurement(0.0, 0, 0.0, why)
        spots = _spots(extents, budget_bytes, MEASURE_SPOTS)
        if how == "fadvise":
            for off, length in spots:
                os.posix_fadvise(fd, off, length, os.POSIX_FADV_DONTNEED)
        got = 0
        start = clock()
        for off, length in spots:
            pos, end = off, off + length
            while pos < end:
                if cancel is not None and cancel.cancelled:
                    return Measurement(0.0, got, clock() - start, "cancelled")
                n = os.preadv(fd, [memoryview(buf)[: min(CHUNK, end - pos)]], pos)
                if n <= 0:
                    break
                got += n
                pos += n
            if clock() - start > budget_s:
                break
        seconds = clock() - start
    except OSError as exc:
        return Measurement(0.0, 0, 0.0, f"reading {path.name} failed: {exc.strerror or exc}")
    finally:
        buf.close()
        os.close(fd)
    if got < MIN_MEASURED or seconds <= 0:
        return Measurement(
            0.0, got, seconds, f"only {got // MiB} MiB could be read in {seconds:.1f} s"
        )
    return Measurement(got / seconds, got, seconds, "", how)


# ------------------------------------------------------------------ kept per disk


@dataclass(frozen=True)
class RateRecord:
    device: str
    bytes_per_s: float
    bytes_read: int
    file: str
    when: float


def _parse(data: Any) -> dict[str, RateRecord]:
    d = check_dict(data, "disk read rates")
    if check_int(d.get("schema"), "schema", SCHEMA, SCHEMA) != SCHEMA:
        raise ValueError("unknown schema")
    out: dict[str, RateRecord] = {}
    for item in d.get("devices", [])[:MAX_DEVICES]:
        item = check_dict(item, "device")
        rec = RateRecord(
            device=check_text(item["device"], "device", 256),
            bytes_per_s=check_float(item["bytes_per_s"], "bytes_per_s", 1.0, 1e12),
            bytes_read=check_int(item["bytes_read"], "bytes_read", 1, 1 << 40),
            file=check_text(item["file"], "file", 4096),
            when=check_float(item["when"], "when", 0.0, 1e11),
        )
        out[rec.device] = rec
    return out


_lock = threading.Lock()


class DiskRateStore:
    """The read rates measured on this machine's disks (``disk-read-rates.json``)."""

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = state_dir / RATES_FILE
        self._clock = clock
        self.note = ""

    def _records(self) -> dict[str, RateRecord]:
        out, note = load_checked(
            self.path,
            _parse,
            what="file of disk read rates",
            limit=MAX_FILE_BYTES,
            clock=self._clock,
        )
        if note:
            self.note = note
        return out or {}

    def get(self, device: str) -> RateRecord | None:
        rec = self._records().get(device)
        if rec is None or self._clock() - rec.when > MAX_AGE_S:
            return None
        return rec

    def put(self, rec: RateRecord) -> None:
        with _lock:
            recs = self._records()
            recs[rec.device] = rec
            kept = sorted(recs.values(), key=lambda r: r.when)[-MAX_DEVICES:]
            payload = {
                "schema": SCHEMA,
                "devices": [
                    {
                        "device": r.device,
                        "bytes_per_s": r.bytes_per_s,
                        "bytes_read": r.bytes_read,
                        "file": r.file,
                        "when": r.when,
                    }
                    for r in kept
                ],
            }
            write_private(self.path, json.dumps(payload, indent=1) + "\n")


def read_rate(
    path: Path,
    store: DiskRateStore | None,
    *,
    measure: bool = True,
    filesystem: str = "",
    root: Path = REAL_ROOT,
    cancel: CancelToken | None = None,
) -> Bandwidth:
    """The read rate of the disk holding ``path`` (a model's shard): kept from an
    earlier measurement of that disk, else measured now on ``path`` itself (when
    ``measure``), else the device kind's figure, else ``unknown``."""
    dev = device_of(path, root)
    if dev is not None and store is not None:
        kept = store.get(dev.key)
        if kept is not None:
            return Bandwidth(
                kept.bytes_per_s,
                "measured",
                f"{dev.name}, {kept.bytes_read // MiB} MiB of {Path(kept.file).name} "
                "read with the page cache bypassed",
            )
    why = ""
    if measure and path.is_file():
        m = measure_read_rate(path, cancel=cancel)
        if m.bytes_per_s > 0:
            if dev is not None and store is not None:
                store.put(RateRecord(dev.key, m.bytes_per_s, m.bytes_read, str(path), time.time()))
            where = dev.name if dev is not None else "this disk"
            return Bandwidth(
                m.bytes_per_s,
                "measured",
                f"{where}, {m.bytes_read // MiB} MiB of {path.name} read with the page "
                f"cache bypassed ({m.cache_bypassed})",
            )
        why = m.why_not
    table = table_read_rate(path, filesystem, root)
    if why and table.source == "unknown":
        return Bandwidth(0.0, "unknown", f"{table.note}; not measured: {why}")
    return table


def largest_gguf(folder: Path, *, max_entries: int = 10_000, depth: int = 3) -> Path | None:
    """The ``*.gguf`` regular file under ``folder`` with the most data on disk (at most
    ``depth`` levels down, ``max_entries`` looked at): the file a disk measurement
    reads.  Allocated blocks, not apparent size, so a sparse file does not win."""
    best: tuple[int, Path] | None = None
    seen = 0
    todo = [(folder, 0)]
    while todo and seen < max_entries:
        here, level = todo.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for e in entries:
            seen += 1
            try:
                if e.is_dir(follow_symlinks=False) and level < depth:
                    todo.append((Path(e.path), level + 1))
                elif e.name.endswith(".gguf") and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    blocks = getattr(st, "st_blocks", None)  # absent on Windows
                    size = st.st_size if blocks is None else min(st.st_size, blocks * 512)
                    if best is None or size > best[0]:
                        best = (size, Path(e.path))
            except OSError:
                continue
    return best[1] if best else None


def fmt_read_rate(rate: Bandwidth) -> str:
    """'1.9 GB/s (measured on nvme0n1: ...)', or what a plan assumes and why."""
    if rate.bytes_per_s > 0 and rate.source != "unknown":
        return f"{rate.bytes_per_s / GB:.1f} GB/s ({rate.source}: {rate.note})"
    why = f"; {rate.note}" if rate.note else ""
    return f"unknown (plans assume {ASSUMED_BPS / GB:.1f} GB/s{why})"
