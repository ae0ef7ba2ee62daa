"""Time k3desk's header-only validation against gguf.GGUFReader, on two split sets.

    python bench/validate_shards.py [DIR] [--runs N]

1. The sparse twin of GrEarl's 94-part IQ1_S tier (2,573 tensors, the real
   163,840-token vocabulary in part 1), written into DIR (a temporary folder by
   default; an existing twin there is reused).
2. A set llama.cpp's own tools wrote: the tiny wide Kimi-K3 quantized to Q4_K_M
   by ``llama-quantize`` and cut into 78 parts by ``llama-gguf-split
   --split-max-tensors 2`` (needs the engine's tools beside llama-server).

For each, in one run (page cache warm, as right after a download):

* fresh:  validate_shard_set() as the first call of a process of its own, best of 3,
          with the vocabulary already checked once (its digest in the record of checked
          vocabularies, k3desk/core/gguf/vocabcache.py): what every check after the
          first costs; its CPU time beside it (the wall time of a loaded machine is not
          the program's), and the import of the validator apart;
* first:  the same with an empty record: the first check of a vocabulary ever;
* warm:   validate_shard_set() again and again in this process, best of N;
* gguf:   gguf.GGUFReader on every part (headers + tensor infos), once;
* memory: the peak RSS of a process that only validates the set.

The record lives in a temporary folder, never in the person's cache.
Goals: fresh <= 0.1 s, >= 50x faster than gguf.GGUFReader on the 94-part twin,
peak RSS <= 64 MiB on both.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TIER = "grearl-iq1s"
GOAL_SECONDS = 0.1
GOAL_RATIO = 50
GOAL_RSS = 64 * 1024 * 1024

# Validates the set as the first call of a process of its own; prints the import's and
# the call's wall and CPU times and that process's peak RSS.  (A child forked from this
# process would inherit its high-water mark, so the measuring process starts it.)
_CHILD = """
import json, sys, time
c0, t0 = time.process_time(), time.perf_counter()
from pathlib import Path
from k3desk.core.gguf.validate import validate_shard_set
from k3desk.core.gguf.vocabcache import CheckedVocabularies
c1, t1 = time.process_time(), time.perf_counter()
validate_shard_set(sys.argv[1], checked=CheckedVocabularies(Path(sys.argv[2])))
c2, t2 = time.process_time(), time.perf_counter()
print(json.dumps({"import": t1 - t0, "call": t2 - t1, "call_cpu": c2 - c1}))
"""
_LAUNCHER = """
import json, resource, subprocess, sys
p = subprocess.run([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], capture_output=True,
                   text=True)
r = json.loads(p.stdout) if p.returncode == 0 else {}
print(json.dumps({**r, "rc": p.returncode, "err": p.stderr,
                  "kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


@dataclass(frozen=True)
class Fresh:
    """One validation as the first call of a new process."""

    import_s: float
    call_s: float
    call_cpu_s: float
    rss: int


def fresh_run(first: Path, record: Path) -> Fresh:
    out = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, _CHILD, str(first), str(record)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO), "PATH": ""},
    )
    r = json.loads(out.stdout)
    if r["rc"] != 0:
        raise SystemExit(f"validation failed in the measuring process:\n{r['err']}")
    return Fresh(r["import"], r["call"], r["call_cpu"], int(r["kib"]) * 1024)


def best_fresh(first: Path, record: Path | None, runs: int = 3) -> Fresh:
    """Best of ``runs`` fresh processes; ``record`` None: an empty record each time."""
    results = []
    for _ in range(runs):
        if record is None:
            with tempfile.TemporaryDirectory(prefix="k3-vocab-") as empty:
                results.append(fresh_run(first, Path(empty)))
        else:
            results.append(fresh_run(first, record))
    return min(results, key=lambda f: f.call_s)


def measure(label: str, first: Path, parts: list[Path], runs: int) -> tuple[float, float, int]:
    """(fresh-process seconds with the vocabulary known, gguf.GGUFReader's, peak RSS)."""
    import gguf

    from k3desk.core.gguf.validate import validate_shard_set
    from k3desk.core.gguf.vocabcache import CheckedVocabularies

    with tempfile.TemporaryDirectory(prefix="k3-vocab-") as tmp:
        record = Path(tmp)
        checked = CheckedVocabularies(record)
        layout = validate_shard_set(first, checked=checked)  # warms the page cache too
        warm = float("inf")
        for _ in range(runs):
            t0 = time.perf_counter()
            validate_shard_set(first, checked=checked)
            warm = min(warm, time.perf_counter() - t0)
        fresh = best_fresh(first, record)
        never = best_fresh(first, None)
    t0 = time.perf_counter()
    n_tensors = sum(len(gguf.GGUFReader(p).tensors) for p in parts)
    theirs = time.perf_counter() - t0
    assert n_tensors == layout.tensor_count, (n_tensors, layout.tensor_count)
    rss = max(fresh.rss, never.rss)
    print(f"{label}: {len(parts)} files, {layout.tensor_count:,} tensors")
    print(
        f"  fresh process, vocabulary known : {fresh.call_s:.3f} s "
        f"({fresh.call_cpu_s:.3f} s CPU; best of 3; import {fresh.import_s:.3f} s apart)"
    )
    print(
        f"  fresh process, vocabulary new   : {never.call_s:.3f} s "
        f"({never.call_cpu_s:.3f} s CPU; best of 3)"
    )
    print(f"  same process, again             : {warm:.3f} s (best of {runs})")
    print(f"  gguf.GGUFReader x {len(parts):<14}: {theirs:.3f} s")
    print(f"  ratio                           : {theirs / fresh.call_s:.0f}x faster")
    print(f"  peak RSS, validating only       : {rss / 2**20:.1f} MiB")
    return fresh.call_s, theirs, rss


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
    parser.add_argument(
        "--runs", type=int, default=5, help="timed runs in this process (best is kept)"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="k3-bench-") as tmp:
        directory = args.dir or Path(tmp) / "twin"
        first, parts = twin_set(directory)
        ours, theirs, rss = measure("94-part twin", first, parts, args.runs)
        ok = ours <= GOAL_SECONDS and theirs / ours >= GOAL_RATIO and rss <= GOAL_RSS
        print(
            f"  goal (fresh <= {GOAL_SECONDS} s, >= {GOAL_RATIO}x, <= 64 MiB):",
            "met" if ok else "NOT met",
        )
        split = llama_split_set(Path(tmp) / "llama-split")
        if split is not None:
            s_ours, _, s_rss = measure("set written by llama-gguf-split", *split, args.runs)
            s_ok = s_ours <= GOAL_SECONDS and s_rss <= GOAL_RSS
            print(f"  goal (fresh <= {GOAL_SECONDS} s, <= 64 MiB):", "met" if s_ok else "NOT met")
            ok = ok and s_ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
