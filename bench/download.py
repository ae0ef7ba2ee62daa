"""k3desk download vs huggingface_hub's own `hf download`, same 9-shard set, same stand-in Hub.

    python bench/download.py [--shard-mib 48] [--rounds 3] [--parallel 8]

A Hub stand-in (tests/hubserver.py) serves nine generated shards from disk on
127.0.0.1 (plain HTTP, no Xet, like ``HF_HUB_DISABLE_XET=1``).  Each round runs,
in alternating order, ``python -m k3desk download --repo ... --include ...``
and ``hf download ... --include ... --local-dir ...`` into empty folders, both
as fresh processes (start-up included).  k3desk's time includes hashing every
byte (SHA-256, checked against the Hub); hf's plain-HTTP path checks sizes only.
Prints per-round wall times, the medians and the ratio (goal: <= 1.1x hf).

A second table compares the libraries without process start-up: k3desk's
``DownloadJob`` against huggingface_hub's ``snapshot_download``, alternating in
one child process (the stand-in stays in this one).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.hubserver import HubServer  # noqa: E402 - needs the repo on sys.path

REPO_ID = "bench/Kimi-K3-Bench-GGUF"
PATTERN = "Kimi-K3-Bench-IQ1_S-*-of-00009.gguf"


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


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{cmd[:3]} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return seconds


def check(target: Path, files: dict[str, Path]) -> None:
    for name, src in files.items():
        if name.endswith(".gguf"):
            got = target / name
            if got.stat().st_size != src.stat().st_size:
                sys.exit(f"{got} has the wrong size")


def library_child(endpoint: str, rounds: int, parallel: int, work: Path) -> None:
    """In a child process: DownloadJob vs snapshot_download, alternating; prints JSON."""
    import json

    from huggingface_hub import snapshot_download

    from k3desk.core.hub.job import DownloadJob
    from k3desk.core.hub.model import DownloadOptions, DownloadRequest

    times: dict[str, list[float]] = {"k3desk": [], "hf": []}
    for rnd in range(rounds):
        for tool in ["k3desk", "hf"] if rnd % 2 == 0 else ["hf", "k3desk"]:
            target = work / f"lib-{tool}-{rnd}"
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
            shutil.rmtree(target)
    print(json.dumps(times))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shard-mib", type=int, default=48, help="size of each of the 9 shards")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=8, help="files at once (hf's default is 8)")
    ap.add_argument("--library-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.library_child:
        endpoint, lib_work = args.library_child
        library_child(endpoint, args.rounds, args.parallel, Path(lib_work))
        return 0

    work = Path(tempfile.mkdtemp(prefix="k3bench-"))
    try:
        files = make_shards(work / "served", args.shard_mib)
        total = sum(p.stat().st_size for n, p in files.items() if n.endswith(".gguf"))
        hf_bin = shutil.which("hf", path=str(Path(sys.executable).parent)) or "hf"
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
            k3_cmd = [
                sys.executable, "-m", "k3desk", "download", "--repo", REPO_ID,
                "--include", PATTERN, "--parallel", str(args.parallel), "--margin", "0",
                "--no-hf-cache", "--json", "--to",
            ]  # fmt: skip
            hf_cmd = [
                hf_bin, "download", REPO_ID, "--include", PATTERN,
                "--max-workers", str(args.parallel), "--local-dir",
            ]  # fmt: skip
            times: dict[str, list[float]] = {"k3desk": [], "hf": []}
            print(
                f"9 shards x {args.shard_mib} MiB = {total / 2**20:.0f} MiB, "
                f"{args.parallel} files at once, {args.rounds} rounds, cores: {os.cpu_count()}"
            )
            for rnd in range(args.rounds):
                order = ["k3desk", "hf"] if rnd % 2 == 0 else ["hf", "k3desk"]
                for tool in order:
                    target = work / f"{tool}-{rnd}"
                    cmd = (k3_cmd if tool == "k3desk" else hf_cmd) + [str(target)]
                    seconds = timed(cmd, env)
                    check(target, files)
                    times[tool].append(seconds)
                    print(
                        f"  round {rnd + 1}: {tool:7s} {seconds:6.2f} s "
                        f"({total / seconds / 2**20:6.0f} MiB/s)"
                    )
                    shutil.rmtree(target)
            child_cmd = [
                sys.executable, __file__, "--library-child", hub.endpoint, str(work),
                "--rounds", str(args.rounds), "--parallel", str(args.parallel),
            ]  # fmt: skip
            child = subprocess.run(
                child_cmd,
                env=env,
                capture_output=True,
                text=True,
            )
            if child.returncode != 0:
                sys.exit(f"library comparison failed:\n{child.stderr[-2000:]}")
            import json

            lib = json.loads(child.stdout.strip().splitlines()[-1])
        lib_k3, lib_hf = statistics.median(lib["k3desk"]), statistics.median(lib["hf"])
        k3 = statistics.median(times["k3desk"])
        hf = statistics.median(times["hf"])
        ratio = k3 / hf
        print(f"median: k3desk {k3:.2f} s (SHA-256 verified), hf download {hf:.2f} s (size only)")
        verdict = "met" if ratio <= 1.1 else "NOT met"
        print(f"ratio k3desk/hf = {ratio:.2f}x  (goal <= 1.10x): {verdict}")
        print(
            f"libraries, no start-up (median of {args.rounds}): DownloadJob {lib_k3:.2f} s, "
            f"snapshot_download {lib_hf:.2f} s, ratio {lib_k3 / lib_hf:.2f}x"
        )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
