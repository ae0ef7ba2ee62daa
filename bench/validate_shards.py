"""Time k3desk's header-only validation against gguf.GGUFReader, on two split sets.

    python bench/validate_shards.py [DIR]

1. The sparse twin of GrEarl's 94-part IQ1_S tier (2,573 tensors, the real
   163,840-token vocabulary in part 1), written into DIR (a temporary folder by
   default; an existing twin there is reused).
2. A set llama.cpp's own tools wrote: the tiny wide Kimi-K3 quantized to Q4_K_M
   by ``llama-quantize`` and cut into 78 parts by ``llama-gguf-split
   --split-max-tensors 2`` (needs the engine's tools beside llama-server).

For each, in one run:

* ours:   validate_shard_set() on the set (reads every header, checks it against
          llama.cpp's rules, builds the layout), best of 5 runs, page cache warm;
* gguf:   gguf.GGUFReader on every part (headers + tensor infos), once;
* memory: the peak RSS of a fresh process that only validates the set.

Goals: ours <= 0.1 s, >= 50x faster than gguf.GGUFReader on the 94-part twin,
peak RSS <= 64 MiB on both.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TIER = "grearl-iq1s"
GOAL_SECONDS = 0.1
GOAL_RATIO = 50
GOAL_RSS = 64 * 1024 * 1024

# Validates the set in a process of its own and prints that process's peak RSS.
# (A child forked from this process would inherit its high-water mark, so the
# measuring process starts the validating one.)
_LAUNCHER = """
import json, resource, subprocess, sys
code = "import sys; from k3desk.core.gguf.validate import validate_shard_set as v; v(sys.argv[1])"
p = subprocess.run([sys.executable, "-c", code, sys.argv[1]], capture_output=True, text=True)
print(json.dumps({"rc": p.returncode, "err": p.stderr,
                  "kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def peak_rss(first: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, str(first)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO), "PATH": ""},
    )
    r = json.loads(out.stdout)
    if r["rc"] != 0:
        raise SystemExit(f"validation failed in the measuring process:\n{r['err']}")
    return int(r["kib"]) * 1024


def measure(label: str, first: Path, parts: list[Path], runs: int) -> tuple[float, float, int]:
    import gguf

    from k3desk.core.gguf.validate import validate_shard_set

    validate_shard_set(first)  # warm the page cache, as right after a download
    ours = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        layout = validate_shard_set(first)
        ours = min(ours, time.perf_counter() - t0)
    t0 = time.perf_counter()
    n_tensors = sum(len(gguf.GGUFReader(p).tensors) for p in parts)
    theirs = time.perf_counter() - t0
    assert n_tensors == layout.tensor_count, (n_tensors, layout.tensor_count)
    rss = peak_rss(first)
    print(f"{label}: {len(parts)} files, {layout.tensor_count:,} tensors")
    print(f"  k3desk validate_shard_set : {ours:.3f} s (best of {runs})")
    print(f"  gguf.GGUFReader x {len(parts):<8}: {theirs:.3f} s")
    print(f"  ratio                     : {theirs / ours:.0f}x faster")
    print(f"  peak RSS, validating only : {rss / 2**20:.1f} MiB")
    return ours, theirs, rss


def twin_set(directory: Path) -> tuple[Path, list[Path]]:
    from k3desk.core.catalog.loader import load_catalog
    from k3desk.core.resources import resources_dir
    from k3desk.devtools.twin import write_twin

    tier = load_catalog(resources_dir() / "catalog.json").get(TIER)
    first = directory / tier.first_shard
    if first.exists():
        print(f"reusing {directory}")
        return first, sorted(directory.glob("Kimi-K3-IQ1_S-*-of-00094.gguf"))
    t0 = time.perf_counter()
    parts = write_twin(tier, directory)
    print(f"wrote the {len(parts)}-part twin in {time.perf_counter() - t0:.2f} s")
    return parts[0], parts


def llama_split_set(directory: Path) -> tuple[Path, list[Path]] | None:
    from k3desk.core.engines.discovery import package_server
    from k3desk.devtools.tinyk3 import write_tiny_k3

    server = package_server()
    if server is None or not (server.parent / "llama-gguf-split").is_file():
        print("no llama-gguf-split beside llama-server: the second set is skipped")
        return None
    bin_dir = server.parent
    base = write_tiny_k3(directory / "f16", name="Tiny-K3-F16", wide=True)
    q = directory / "Tiny-K3-Q4_K_M.gguf"
    for argv in (
        [bin_dir / "llama-quantize", base.first_part, q, "Q4_K_M"],
        [bin_dir / "llama-gguf-split", "--split-max-tensors", "2", q, directory / "Tiny-K3"],
    ):
        subprocess.run([str(a) for a in argv], capture_output=True, check=True, timeout=300)
    parts = sorted(directory.glob("Tiny-K3-*-of-*.gguf"))
    return parts[0], parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", nargs="?", type=Path, help="where the twin is (or goes)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs of ours (best is kept)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="k3-bench-") as tmp:
        directory = args.dir or Path(tmp) / "twin"
        first, parts = twin_set(directory)
        ours, theirs, rss = measure("94-part twin", first, parts, args.runs)
        ok = ours <= GOAL_SECONDS and theirs / ours >= GOAL_RATIO and rss <= GOAL_RSS
        print(
            f"  goal (<= {GOAL_SECONDS} s, >= {GOAL_RATIO}x, <= 64 MiB):",
            "met" if ok else "NOT met",
        )
        split = llama_split_set(Path(tmp) / "llama-split")
        if split is not None:
            s_ours, _, s_rss = measure("set written by llama-gguf-split", *split, args.runs)
            s_ok = s_ours <= GOAL_SECONDS and s_rss <= GOAL_RSS
            print(f"  goal (<= {GOAL_SECONDS} s, <= 64 MiB):", "met" if s_ok else "NOT met")
            ok = ok and s_ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
