"""k3desk download vs huggingface_hub's `hf download`, and vs the link, from the Hub stand-in.

    python bench/download.py [--shard-mib 1024] [--rounds 3] [--parallel 8] [--links 0,10,1]

A Hub stand-in (tests/hubserver.py) serves nine generated shards from disk on
127.0.0.1 (plain HTTP, no Xet, like ``HF_HUB_DISABLE_XET=1``), with
``os.sendfile``; for each link in ``--links`` (Gbit/s, 0 = loopback unlimited)
it paces all connections together to that rate (``HubServer.link_bps``).  Per
link:

* **the stand-in's own rate**: a bare client (raw sockets, ``recv_into``, bytes
  thrown away) fetches the nine shards, ``--parallel`` at once: what the
  stand-in and the link deliver when the client costs next to nothing;
* ``python -m k3desk download`` and ``hf download`` into empty folders, fresh
  processes, in alternating order, ``--rounds`` each.  k3desk's time includes
  SHA-256 of every byte, checked against the Hub; hf's plain-HTTP path checks
  sizes only.  Wall times include process start-up and the listing; k3desk's
  transfer rate is timed from its ``preflight`` event (the listing done, no file
  requested yet) to its ``done`` event (every file's metadata request, transfer
  and verification: what a 300 GB tier spends its time in), and the CPU seconds
  each process used per GiB, with how busy the cores and the work folder's disk
  were meanwhile (``/proc/stat``, ``/proc/diskstats``: over k3desk's transfer,
  over hf's whole run).  Cores near 100 % held a round up; the disk's share
  counts the time with any write in flight, so near 100 % it is the likely
  limit, though a disk serving several writes at once can have more to give.

Goals: k3desk <= 0.9x hf download's wall time (median, unlimited link) and
k3desk's transfer rate >= 90 % of each limited link.  On a loaded machine the
wall times are noisy; CPU seconds per GiB are the steadier figure.

A last table compares the libraries without process start-up on the unlimited
link: k3desk's ``DownloadJob`` against ``snapshot_download``, alternating in one
child process (the stand-in stays in this one), with the CPU seconds each client
spends per GiB.

Two anchors say what the machine allows at all, whichever client: the CPU both
ends need per GiB (the client's, from that table, plus the stand-in's, measured
in this process during k3desk's rounds) against the cores, as a share of a
10 Gbit/s link; and the rate the disk under the work folder sustains when written
and flushed (``--disk-mib``), through the page cache and around it as k3desk
writes (O_DIRECT): the shards here fit in the page cache, a 300 GB tier does not,
and through it runs at the disk's rate once the dirty limit is reached.
k3desk's transfer rate includes its checkpoints (an ``fsync`` every
``checkpoint_bytes`` of a file, on a helper thread).  ``--work /dev/shm`` (a
tmpfs) does not time the clients without the disk: every write there is a copy
into memory by the CPU (``dd`` to tmpfs on the 2-core VM: 2.1 GB/s, about half a
CPU second per GiB, more with eight writers), where O_DIRECT to a disk is not;
k3desk's client took 2.2 CPU s per GiB there against 1.0 on ext4.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.hubserver import HubServer  # noqa: E402 - needs the repo on sys.path

REPO_ID = "bench/Kimi-K3-Bench-GGUF"
PATTERN = "Kimi-K3-Bench-IQ1_S-*-of-00009.gguf"
MiB = 1 << 20
LINK10 = 10 * 125_000_000 / MiB  # a 10 Gbit/s link, MiB/s


def make_shards(folder: Path, shard_mib: int) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    block = hashlib.sha256(b"k3desk bench").digest() * (1 << 15)  # 1 MiB, fixed
    for i in range(1, 10):
        name = f"Kimi-K3-Bench-IQ1_S-{i:05d}-of-00009.gguf"
        path = folder / name
        with path.open("wb") as f:
            f.write(b"GGUF")
            for j in range(shard_mib):
                # vary every MiB so no two blocks (or shards) are alike
                f.write(hashlib.sha256(f"{i}/{j}".encode()).digest() + block[32:])
        files[name] = path
    (folder / "README.md").write_text("not downloaded\n")
    files["README.md"] = folder / "README.md"
    return files


Sample = tuple[float, int, int, int, int]


class Busy:
    """How busy the cores and the work folder's disk were over a span: the share of
    CPU time not idle (``/proc/stat``), the share of wall time the disk had a request
    in flight (``io_ticks``, ``/proc/diskstats``) and what it wrote.  Where the
    folder has no block device (a tmpfs) only the CPU is told."""

    def __init__(self, folder: Path) -> None:
        self.disk = ""
        try:
            st = os.stat(folder)
            link = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
            self.disk = link.resolve().name if link.exists() else ""
        except OSError:
            pass

    def sample(self) -> Sample:
        """(time, busy jiffies, all jiffies, disk ms with I/O in flight, sectors written)."""
        now = time.monotonic()
        try:
            cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            cpu = [0] * 5
        idle = cpu[3] + cpu[4]  # idle and iowait
        ticks = written = 0
        if self.disk:
            for line in Path("/proc/diskstats").read_text().splitlines():
                f = line.split()
                if len(f) > 12 and f[2] == self.disk:
                    written, ticks = int(f[9]), int(f[12])
        return now, sum(cpu) - idle, sum(cpu), ticks, written

    def describe(self, a: Sample, b: Sample) -> str:
        seconds = b[0] - a[0]
        all_jiffies = b[2] - a[2]
        text = f"CPU {(b[1] - a[1]) / all_jiffies:.0%} busy" if all_jiffies > 0 else ""
        if self.disk and seconds > 0:
            busy = (b[3] - a[3]) / 1000 / seconds
            rate = (b[4] - a[4]) * 512 / MiB / seconds
            text += f", disk {min(busy, 1.0):.0%} busy ({rate:.0f} MiB/s written)"
        return text


def timed(cmd: list[str], env: dict[str, str], busy: Busy) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds of the process, transfer seconds, how busy the
    cores and the disk were: over the transfer for k3desk, the whole run for hf).

    The transfer: from k3desk's ``preflight`` JSON event to its ``done`` event,
    timed here as the lines arrive (listing and start-up left out; every file's
    metadata request, transfer and verification in); 0 for hf.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = end = busy.sample()
    t0 = time.perf_counter()
    first = done = 0.0
    with (
        tempfile.TemporaryFile("w+") as errs,
        subprocess.Popen(
            cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=errs, text=True
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"kind": "preflight"' in line and not first:
                first = time.perf_counter()
                start = busy.sample()
            elif '"kind": "done"' in line:
                done = time.perf_counter()
                end = busy.sample()
        rc = proc.wait()
        errs.seek(0)
        err = errs.read()
    seconds = time.perf_counter() - t0
    if not done:
        end = busy.sample()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        sys.exit(f"{cmd[:3]} failed ({rc}):\n{err[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu, (done - first if first and done else 0.0), busy.describe(start, end)


def check(target: Path, files: dict[str, Path]) -> None:
    for name, src in files.items():
        if name.endswith(".gguf"):
            got = target / name
            if got.stat().st_size != src.stat().st_size:
                sys.exit(f"{got} has the wrong size")


# ------------------------------------------------------------ the bare client


def raw_get(url: str, buf: bytearray) -> int:
    """GET ``url`` over a plain socket; the body is read into ``buf`` and dropped."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 80)) as s:
        s.sendall(f"GET {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            more = s.recv(65536)
            if not more:
                raise SystemExit(f"{url}: no response")
            head += more
        header, _, body = head.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in header.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        got = len(body)
        view = memoryview(buf)
        while got < length:
            n = s.recv_into(view)
            if not n:
                raise SystemExit(f"{url}: short body")
            got += n
        return got


def raw_child(endpoint: str, parallel: int, names: list[str]) -> None:
    """In a child process: fetch ``names`` with ``parallel`` bare clients; prints seconds."""
    todo = list(names)
    lock = threading.Lock()

    def worker() -> None:
        buf = bytearray(4 * MiB)
        while True:
            with lock:
                if not todo:
                    return
                name = todo.pop(0)
            raw_get(f"{endpoint}/{REPO_ID}/resolve/main/{name}", buf)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(min(parallel, len(names)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(time.perf_counter() - t0)


# ------------------------------------------------------------ libraries, no start-up


def library_child(endpoint: str, rounds: int, parallel: int, work: Path) -> None:
    """In a child process: DownloadJob vs snapshot_download, alternating; prints JSON."""
    from huggingface_hub import snapshot_download

    from k3desk.core.hub.job import DownloadJob
    from k3desk.core.hub.model import DownloadOptions, DownloadRequest

    times: dict[str, list[float]] = {"k3desk": [], "hf": []}
    cpu: dict[str, list[float]] = {"k3desk": [], "hf": []}
    for rnd in range(rounds):
        for tool in ["k3desk", "hf"] if rnd % 2 == 0 else ["hf", "k3desk"]:
            target = work / f"lib-{tool}-{rnd}"
            c0 = time.process_time()  # every thread of this process: the client alone
            t0 = time.perf_counter()
            if tool == "k3desk":
                opts = DownloadOptions(
                    endpoint=endpoint, parallel=parallel, margin_bytes=0, use_hf_cache=False
                )
                DownloadJob(DownloadRequest(REPO_ID, (PATTERN,)), target, opts).run()
            else:
                snapshot_download(
                    REPO_ID,
                    allow_patterns=[PATTERN],
                    local_dir=target,
                    max_workers=parallel,
                    endpoint=endpoint,
                    token=False,
                )
            times[tool].append(time.perf_counter() - t0)
            cpu[tool].append(time.process_time() - c0)
            shutil.rmtree(target)
            os.sync()  # the next round does not pay for this one's writeback
    print(json.dumps({"times": times, "cpu": cpu}))


# ------------------------------------------------------------ the machine's own limits


def disk_write_rate(folder: Path, mib: int, direct: bool = False, writers: int = 1) -> float:
    """MiB/s the disk under ``folder`` sustains: ``mib`` MiB written in 4 MiB blocks
    and flushed (``fdatasync``, like ``dd conv=fdatasync``), by ``writers`` threads at
    once, each to a file of its own.  Through the page cache (what ``hf download``
    meets: a download larger than the cache's dirty limit runs at most at this rate;
    the shards of this bench fit in the cache and do not see it), or with ``direct``
    as k3desk writes (O_DIRECT, k3desk.core.hub.diskio: one writer per file in
    flight), where the file system allows it (0.0 where it does not)."""
    import mmap

    block = mmap.mmap(-1, 4 * MiB)  # page-aligned, as direct I/O needs
    block.write(os.urandom(4 * MiB))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    if direct:
        flags |= getattr(os, "O_DIRECT", 0)
    blocks = max(mib // 4 // writers, 1)
    failed: list[OSError] = []

    def write(n: int) -> None:
        path = folder / f"disk-rate-{n}.bin"
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            failed.append(exc)
            return
        try:
            for i in range(blocks):
                os.pwrite(fd, block, i * 4 * MiB)
            os.fdatasync(fd)
        except OSError as exc:
            failed.append(exc)
        finally:
            os.close(fd)
            path.unlink()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    return 0.0 if failed else blocks * writers * 4 / seconds


def _filesystem(folder: Path) -> str:
    """The type of the filesystem holding ``folder`` (from /proc/mounts), or "?"."""
    best, kind = "", "?"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    where = str(folder.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1]
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def _self_cpu() -> float:
    """CPU seconds of this process so far: the stand-in's threads (and little else)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def budget(client_cpu: float, server_cpu: float) -> None:
    """What this machine's CPU allows at all: the CPU both ends of the transfer need
    per GiB against its cores (the stand-in runs here too)."""
    cores = os.cpu_count() or 1
    per_gib = client_cpu + server_cpu
    ceiling = cores / per_gib * 1024 if per_gib > 0 else float("inf")
    print(
        f"CPU per GiB: DownloadJob {client_cpu:.2f} s + the stand-in {server_cpu:.2f} s = "
        f"{per_gib:.2f} s; {cores} cores allow at most {ceiling:.0f} MiB/s with both ends "
        f"here = {ceiling / LINK10:.0%} of a 10 Gbit/s link"
    )


def print_disk(disk: tuple[float, float, float], fs: str, writers: int) -> None:
    """The disk's own rates, measured before the rounds."""
    cached, direct, direct_n = disk
    if cached > 0:
        print(
            f"the work folder's {fs} sustains {cached:.0f} MiB/s written through the page "
            f"cache and flushed = {cached / LINK10:.0%} of a 10 Gbit/s link (what a download "
            "larger than the cache's dirty limit gets through it)"
        )
    if direct > 0:
        print(
            f"and {direct:.0f} MiB/s written around it (O_DIRECT, as k3desk writes) by one "
            f"writer, {direct_n:.0f} MiB/s by {writers} at once (k3desk: one per file in "
            f"flight) = {direct / LINK10:.0%} and {direct_n / LINK10:.0%} of a 10 Gbit/s link"
        )


# ------------------------------------------------------------ main


def _rate(total: int, seconds: float) -> float:
    return total / seconds / MiB


def run_link(
    hub: HubServer,
    gbit: float,
    args: argparse.Namespace,
    env: dict[str, str],
    work: Path,
    files: dict[str, Path],
    total: int,
) -> dict[str, float]:
    hub.link_bps = int(gbit * 125_000_000)
    label = f"{gbit:g} Gbit/s link" if gbit else "unlimited (loopback)"
    names = sorted(n for n in files if n.endswith(".gguf"))
    raw = [
        float(
            subprocess.run(
                [sys.executable, __file__, "--raw-child", hub.endpoint, str(args.parallel), *names],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for _ in range(2)
    ]
    own = _rate(total, min(raw))
    print(f"\n{label}: the stand-in serves {own:.0f} MiB/s to a bare client", end="")
    if gbit:
        print(f" (the link: {hub.link_bps / MiB:.0f} MiB/s)")
    else:
        print()
    hf_bin = shutil.which("hf", path=str(Path(sys.executable).parent)) or "hf"
    k3_cmd = [
        sys.executable, "-m", "k3desk", "download", "--repo", REPO_ID,
        "--include", PATTERN, "--parallel", str(args.parallel), "--margin", "0",
        "--no-hf-cache", "--json", "--to",
    ]  # fmt: skip
    hf_cmd = [
        hf_bin, "download", REPO_ID, "--include", PATTERN,
        "--max-workers", str(args.parallel), "--local-dir",
    ]  # fmt: skip
    busy = Busy(work)
    wall: dict[str, list[float]] = {"k3desk": [], "hf": []}
    cpu: dict[str, list[float]] = {"k3desk": [], "hf": []}
    job: list[float] = []
    served: list[float] = []  # the stand-in's CPU seconds per k3desk round
    for rnd in range(args.rounds):
        for tool in ["k3desk", "hf"] if rnd % 2 == 0 else ["hf", "k3desk"]:
            target = work / f"{tool}-{rnd}"
            cmd = (k3_cmd if tool == "k3desk" else hf_cmd) + [str(target)]
            before = _self_cpu()
            seconds, cpu_s, transfer, usage = timed(cmd, env, busy)
            if tool == "k3desk":
                served.append(_self_cpu() - before)
            check(target, files)
            wall[tool].append(seconds)
            cpu[tool].append(cpu_s)
            extra = ""
            if tool == "k3desk":
                job.append(transfer)
                extra = f", transfer {_rate(total, job[-1]):5.0f} MiB/s"
            print(
                f"  round {rnd + 1}: {tool:7s} {seconds:6.2f} s "
                f"({_rate(total, seconds):5.0f} MiB/s{extra}), "
                f"{cpu_s / (total / 2**30):.2f} CPU s/GiB" + (f", {usage}" if usage else "")
            )
            shutil.rmtree(target)
            # hf's shards sit dirty in the page cache after it exits: flushed here, so
            # that the next round (k3desk's or hf's) does not pay for this one's writeback
            os.sync()
    k3, hf = statistics.median(wall["k3desk"]), statistics.median(wall["hf"])
    k3_rate = _rate(total, statistics.median(job))
    print(
        f"  median: k3desk {k3:.2f} s (SHA-256 verified), hf download {hf:.2f} s (sizes only): "
        f"{k3 / hf:.2f}x; k3desk's transfer {k3_rate:.0f} MiB/s = {k3_rate / own:.0%} of the "
        "stand-in's own rate"
        + (f", {k3_rate / (hub.link_bps / MiB):.0%} of the link" if gbit else "")
    )
    gib = total / 2**30
    k3_cpu, hf_cpu = statistics.median(cpu["k3desk"]) / gib, statistics.median(cpu["hf"]) / gib
    print(f"  CPU per GiB (median): k3desk {k3_cpu:.2f} s, hf {hf_cpu:.2f} s")
    return {
        "ratio": k3 / hf,
        "link_share": k3_rate / (hub.link_bps / MiB) if gbit else 0.0,
        "server_cpu": statistics.median(served) / gib,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shard-mib",
        type=int,
        default=1024,
        help="size of each of the 9 shards (a tier's average 13-37 GB; smaller ones weigh "
        "per-file costs a real download does not have)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=8, help="files at once (hf's default is 8)")
    ap.add_argument("--links", default="0,10,1", help="Gbit/s per run, 0 = unlimited")
    ap.add_argument("--no-library", action="store_true", help="skip the no-start-up table")
    ap.add_argument(
        "--disk-mib", type=int, default=2048, help="MiB written to time the disk (0: skip)"
    )
    ap.add_argument(
        "--work",
        type=Path,
        help="folder for the served shards and the downloads (default: the temp folder); "
        "a tmpfs such as /dev/shm trades the disk for the CPU's copies into memory",
    )
    ap.add_argument("--library-child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--raw-child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.library_child:
        endpoint, lib_work = args.library_child
        library_child(endpoint, args.rounds, args.parallel, Path(lib_work))
        return 0
    if args.raw_child:
        raw_child(args.raw_child[0], int(args.raw_child[1]), args.raw_child[2:])
        return 0

    # the served shards, one round's download and the disk's timing files at once
    need = (2 * 9 * args.shard_mib + args.disk_mib) * MiB
    free = shutil.disk_usage(args.work or tempfile.gettempdir()).free
    if free < need * 1.05:
        sys.exit(
            f"the work folder has {free / 2**30:.1f} GiB free; this run needs about "
            f"{need / 2**30:.1f} GiB (choose another with --work, or smaller --shard-mib)"
        )
    work = Path(tempfile.mkdtemp(prefix="k3bench-", dir=args.work))
    try:
        disk = (
            (
                disk_write_rate(work, args.disk_mib),
                disk_write_rate(work, args.disk_mib, True),
                disk_write_rate(work, args.disk_mib, True, args.parallel),
            )
            if args.disk_mib
            else (0.0, 0.0, 0.0)
        )
        files = make_shards(work / "served", args.shard_mib)
        os.sync()  # the served shards on the disk before any round, not flushed during one
        total = sum(p.stat().st_size for n, p in files.items() if n.endswith(".gguf"))
        with HubServer() as hub:
            hub.add_repo(REPO_ID, dict(files.items()))
            env = dict(os.environ)
            env.update(
                {
                    "HF_ENDPOINT": hub.endpoint,
                    "HF_HUB_DISABLE_XET": "1",
                    "HF_HUB_DISABLE_TELEMETRY": "1",
                    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                    "HF_HOME": str(work / "hf-home"),
                    "K3DESK_HOME": str(work / "k3-home"),
                }
            )
            env.pop("HF_TOKEN", None)
            print(
                f"9 shards x {args.shard_mib} MiB = {total / MiB:.0f} MiB, "
                f"{args.parallel} files at once, {args.rounds} rounds, cores: {os.cpu_count()}, "
                f"load average {os.getloadavg()[0]:.2f}; written to {work} "
                f"({_filesystem(work)})"
            )
            print_disk(disk, _filesystem(work), args.parallel)
            results = {
                float(g): run_link(hub, float(g), args, env, work, files, total)
                for g in args.links.split(",")
            }
            hub.link_bps = 0
            lib = None
            if not args.no_library:
                child_cmd = [
                    sys.executable, __file__, "--library-child", hub.endpoint, str(work),
                    "--rounds", str(args.rounds), "--parallel", str(args.parallel),
                ]  # fmt: skip
                child = subprocess.run(child_cmd, env=env, capture_output=True, text=True)
                if child.returncode != 0:
                    sys.exit(f"library comparison failed:\n{child.stderr[-2000:]}")
                lib = json.loads(child.stdout.strip().splitlines()[-1])
        print()
        server_cpu = statistics.median(r["server_cpu"] for r in results.values())
        if lib is not None:
            times, cpu = lib["times"], lib["cpu"]
            lib_k3, lib_hf = statistics.median(times["k3desk"]), statistics.median(times["hf"])
            gib = total / 2**30
            cpu_k3, cpu_hf = (statistics.median(cpu[t]) / gib for t in ("k3desk", "hf"))
            print(
                f"libraries, no start-up, unlimited (median of {args.rounds}): DownloadJob "
                f"{lib_k3:.2f} s, snapshot_download {lib_hf:.2f} s, ratio {lib_k3 / lib_hf:.2f}x; "
                f"client CPU per GiB: DownloadJob {cpu_k3:.2f} s, snapshot_download {cpu_hf:.2f} s"
            )
            budget(cpu_k3, server_cpu)
        for gbit, r in results.items():
            if gbit == 0:
                ok = "met" if r["ratio"] <= 0.9 else "NOT met"
                print(f"unlimited: k3desk/hf = {r['ratio']:.2f}x (goal <= 0.90x): {ok}")
            else:
                ok = "met" if r["link_share"] >= 0.9 else "NOT met"
                print(
                    f"{gbit:g} Gbit/s: k3desk at {r['link_share']:.0%} of the link, "
                    f"{r['ratio']:.2f}x hf's time (goal >= 90 %): {ok}"
                )
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
