"""Streaming a model larger than RAM, on real bytes: k3desk's prediction against llama-server.

    python bench/stream_real.py [--dir /work/stream-real] [--tier vcruz305-ud-iq1s]
        [--layers 12] [--tokens 24] [--runs cold,warm] [--keep] [--json FILE]

Writes (once; reused while it is there) a real-bytes rehearsal of a published tier
(``python -m k3desk.devtools real-bytes``: the tier's real tensor shapes and types, its
first ``--layers`` layers, every byte of data on the disk, not holes), sized at
1.5-2x this machine's RAM.  Then:

1. The prediction, by the code path a launch takes: the shard set validated, this
   machine detected (its RAM bandwidth measured), the read rate of the disk measured
   on the model file itself (``disk_rate.read_rate``: O_DIRECT reads of its data),
   ``make_plan``: the verdict, the decode speed, the load time, the disk bytes per
   token.
2. llama-server alone on the file, with the plan's own arguments: each run of
   ``--runs`` ("cold": the file's pages dropped first with
   ``posix_fadvise(POSIX_FADV_DONTNEED)``, its own pages only, the machine being
   shared; "warm": straight after the previous run), measuring the load time (spawn
   to ``/health`` 200), the prompt and decode speed of one ``/completion``
   (``ignore_eos``, a fixed seed, ``n_predict`` tokens; the server's own timings), and
   from ``/proc/PID/io`` and ``/proc/PID/stat`` the bytes read from disk, the major
   page faults and the CPU seconds, per decoded token (from the first token streamed
   to the last: prompt processing excluded).
3. Predicted against measured, the ratio printed; goal: decode and load within
   +/-25 %.  The model file is deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from k3desk.core.catalog.loader import load_catalog  # noqa: E402
from k3desk.core.engines.discovery import find_llama_server  # noqa: E402
from k3desk.core.engines.ports import free_port  # noqa: E402
from k3desk.core.gguf.validate import validate_shard_set  # noqa: E402
from k3desk.core.hardware.detect import detect_hardware, filesystem_type  # noqa: E402
from k3desk.core.hardware.disk_rate import (  # noqa: E402
    fmt_read_rate,
    read_around_bytes,
    read_rate,
)
from k3desk.core.paths import default_paths  # noqa: E402
from k3desk.core.planning.model import LaunchPlan, PlanOptions  # noqa: E402
from k3desk.core.planning.plan import make_plan, with_disk_rate  # noqa: E402
from k3desk.core.planning.speed import speed_lines  # noqa: E402
from k3desk.core.process import Child, spawn  # noqa: E402
from k3desk.core.resources import resources_dir  # noqa: E402
from k3desk.core.units import GB, GiB  # noqa: E402
from k3desk.devtools.realbytes import file_bytes, write_real_bytes  # noqa: E402

GOAL = 0.25
MAX_FILE = 45 * 10**9  # what this bench may write (a shared disk)
PROMPT = "Tell me a story about the sea."
CTX = 4096
PAGE = os.sysconf("SC_PAGE_SIZE")
CLK = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    t: float
    read_bytes: int
    majflt: int
    cpu_s: float


def sample(pid: int) -> Sample:
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields after the name: state(0) ... majflt(9) utime(11) stime(12)
    return Sample(
        time.perf_counter(),
        int(io["read_bytes"]),
        int(stat[9]),
        (int(stat[11]) + int(stat[12])) / CLK,
    )


@dataclass
class Run:
    kind: str
    when: str
    cached_before_gib: float  # the file's pages in the page cache at the start
    available_gib: float
    load_s: float
    load_read_gb: float
    prompt_tokens: int
    prompt_tps: float
    decode_tokens: int
    decode_tps: float
    decode_s_per_token: float
    disk_gb_per_token: float
    majflt_per_token: float
    cpu_s_per_token: float
    rss_anon_gib: float


def cached_bytes(path: Path) -> int:
    """The file's pages now in the page cache (mincore over a read-only mapping)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = path.stat().st_size
    total = 0
    step = 1 << 30
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in range(0, size, step):
            n = min(step, size - off)
            addr = libc.mmap(None, n, 1, 1, fd, off)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                return -1
            pages = (n + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            libc.mincore(addr, n, vec)
            total += sum(bytes(vec)) * PAGE  # each byte is 1 (resident) or 0
            libc.munmap(addr, n)
    finally:
        os.close(fd)
    return total


def drop_file_cache(path: Path) -> str:
    """Drop the file's pages (only its own: the machine is shared, so not every
    cache with ``/proc/sys/vm/drop_caches``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return "posix_fadvise(DONTNEED)"


def available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def rss_anon(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def wait_ready(child: Child, url: str, limit_s: float) -> None:
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        if child.returncode is not None or child.popen.poll() is not None:
            raise SystemExit(f"llama-server ended while loading (exit {child.popen.returncode})")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"llama-server not ready within {limit_s:.0f} s")


def complete(url: str, pid: int, tokens: int) -> tuple[dict[str, Any], Sample, Sample]:
    """One streamed /completion; the samples at the first token and at the last."""
    body = {
        "prompt": PROMPT,
        "n_predict": tokens,
        "ignore_eos": True,
        "seed": 42,
        "temperature": 0.8,
        "stream": True,
        "cache_prompt": False,
    }
    first: Sample | None = None
    last: dict[str, Any] = {}
    with httpx.stream("POST", url + "/completion", json=body, timeout=3600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if first is None:
                first = sample(pid)
            last = data
    end = sample(pid)
    if first is None or "timings" not in last:
        raise SystemExit(f"no timings in the server's answer: {last}")
    return last["timings"], first, end


def one_run(kind: str, engine: Path, plan: LaunchPlan, path: Path, tokens: int) -> Run:
    dropped = drop_file_cache(path) if kind == "cold" else ""
    cached = cached_bytes(path)
    avail = available()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [str(engine), *plan.server_args, "--host", "127.0.0.1", "--port", str(port)]
    log = (path.parent / f"server-{kind}.log").open("wb")
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n[{kind}] {when}: {dropped or 'pages kept'}; {cached / GiB:.1f} GiB of the file "
          f"cached, {avail / GiB:.1f} GiB available", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    child = spawn(argv, stdout=log, stderr=subprocess_stdout())
    try:
        wait_ready(child, url, 3600)
        ready = sample(child.pid)
        load_s = ready.t - t0
        print(f"[{kind}] ready in {load_s:.1f} s, {ready.read_bytes / GB:.1f} GB read", flush=True)
        timings, first, end = complete(url, child.pid, tokens)
        anon = rss_anon(child.pid)
    finally:
        child.popen.terminate()
        with contextlib.suppress(Exception):
            child.popen.wait(30)
        if child.popen.poll() is None:
            child.popen.kill()
            child.popen.wait()
        log.close()
    n = int(timings["predicted_n"])
    # the first streamed token ends the prompt (and its first decode step): the
    # samples between it and the last cover n - 1 decode steps
    steps = max(n - 1, 1)
    return Run(
        kind=kind,
        when=when,
        cached_before_gib=round(cached / GiB, 2),
        available_gib=round(avail / GiB, 2),
        load_s=round(load_s, 2),
        load_read_gb=round(ready.read_bytes / GB, 2),
        prompt_tokens=int(timings["prompt_n"]),
        prompt_tps=round(float(timings["prompt_per_second"]), 4),
        decode_tokens=n,
        decode_tps=round(float(timings["predicted_per_second"]), 4),
        # the server's own per-step figure: the generation time over its n - 1 steps
        # (server_slot's t_gen_per_token_ms, tools/server/server-common.h, b11434)
        decode_s_per_token=round(float(timings["predicted_per_token_ms"]) / 1e3, 3),
        disk_gb_per_token=round((end.read_bytes - first.read_bytes) / steps / GB, 3),
        majflt_per_token=round((end.majflt - first.majflt) / steps, 1),
        cpu_s_per_token=round((end.cpu_s - first.cpu_s) / steps, 3),
        rss_anon_gib=round(anon / GiB, 2),
    )


def subprocess_stdout() -> int:
    import subprocess

    return subprocess.STDOUT


def ensure_model(args: argparse.Namespace) -> Path:
    tier = load_catalog(resources_dir() / "catalog.json").get(args.tier)
    path = args.dir / f"{tier.id}-realbytes-{args.layers}L.gguf"
    size = file_bytes(tier, args.layers)
    if path.is_file() and path.stat().st_size == size:
        print(f"model: {path} ({size / GiB:.1f} GiB, reused)")
        return path
    if size > MAX_FILE:
        raise SystemExit(f"{args.layers} layers make {size / GB:.1f} GB, over {MAX_FILE / GB:.0f}")
    t0 = time.perf_counter()
    path = write_real_bytes(tier, args.dir, args.layers)
    print(f"model: {path} ({size / GiB:.1f} GiB, written in {time.perf_counter() - t0:.0f} s)")
    return path


def predict(path: Path, tokens: int) -> tuple[LaunchPlan, str]:
    layout = validate_shard_set(path)
    rate = read_rate(path, None, filesystem=filesystem_type(path))
    hw = detect_hardware(path.parent)
    if hw.disk is not None:
        hw = hw.with_disk(replace(hw.disk, read_rate=rate))
    prompt_depth = 30  # the prompt's tokens: decode is timed at about this depth
    opts = PlanOptions(
        ctx=CTX, speed_depth=prompt_depth + tokens // 2, read_around_bytes=read_around_bytes(path)
    )
    opts = with_disk_rate(hw, opts)
    plan = make_plan(hw, layout, opts)
    ram = f"RAM {hw.memory.total / GiB:.1f} GiB, {hw.memory.available / GiB:.1f} available"
    window = f"read-around {(opts.read_around_bytes or 0) / 2**20:.0f} MiB"
    return plan, f"disk read rate: {fmt_read_rate(rate)}; {window}; {ram}"


def report(plan: LaunchPlan, runs: list[Run]) -> float:
    s = plan.speed
    pred_disk = s.bytes_per_token.get("disk", 0) / GB
    print("\n           predicted   measured   ratio (measured / predicted)")
    worst = 0.0
    for r in runs:
        rows = [
            ("decode s/token", 1 / s.expected_tps, r.decode_s_per_token),
            ("load s", plan.load_seconds, r.load_s),
            ("disk GB/token", pred_disk, r.disk_gb_per_token),
        ]
        print(f"[{r.kind}] prompt {r.prompt_tps:.2f} tok/s (predicted {s.prompt_tps:.2f}); "
              f"{r.majflt_per_token:.0f} major faults and {r.cpu_s_per_token:.2f} CPU s "
              "per token")  # fmt: skip
        for name, p, m in rows:
            ratio = m / p if p > 0 else float("inf")
            print(f"  {name:15} {p:9.3f} {m:10.3f}   {ratio:.2f}")
            if name != "disk GB/token":
                worst = max(worst, abs(ratio - 1))
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/work/stream-real"))
    ap.add_argument("--tier", default="vcruz305-ud-iq1s")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--runs", default="cold,warm")
    ap.add_argument("--keep", action="store_true", help="keep the model file")
    ap.add_argument("--json", type=Path, help="append the runs to this file (JSON lines)")
    ap.add_argument("--predict-only", action="store_true")
    args = ap.parse_args()
    if args.tokens < 16:
        ap.error("--tokens must be at least 16")
    path = ensure_model(args)
    try:
        plan, rate = predict(path, args.tokens)
        print(rate)
        print(f"plan: {plan.verdict}: {plan.reason}")
        for note in plan.notes:
            print(f"  note: {note}")
        for line in speed_lines(plan.speed):
            print(line)
        print(f"load: {plan.load_seconds:.1f} s predicted")
        if args.predict_only:
            return 0
        engine = find_llama_server(default_paths())
        if engine is None:
            raise SystemExit("no llama-server found")
        runs = [one_run(k, engine, plan, path, args.tokens) for k in args.runs.split(",")]
        for r in runs:
            print(json.dumps(asdict(r)))
        worst = report(plan, runs)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps({"plan_tps": plan.speed.expected_tps,
                                    "plan_load_s": plan.load_seconds,
                                    "runs": [asdict(r) for r in runs]}) + "\n")  # fmt: skip
        print(f"\nworst decode/load error: {worst:.0%} (goal {GOAL:.0%})")
        return 0 if worst <= GOAL else 1
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
            print(f"deleted {path}")


if __name__ == "__main__":
    raise SystemExit(main())
