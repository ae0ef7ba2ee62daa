"""Time k3desk's header-only validation against gguf.GGUFReader on a 94-part set.

    python bench/validate_shards.py [DIR]

Writes the sparse twin of GrEarl's 94-part IQ1_S tier into DIR (a temporary
folder by default; an existing twin there is reused), then, in one run:

* ours:   validate_shard_set() on the set (reads every header, checks it, builds
          the layout), best of 5 runs;
* gguf:   gguf.GGUFReader on each of the 94 files (headers + tensor infos), once.

Both read the same files from the page cache.  Goal: ours <= 0.3 s and >= 10x faster.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TIER = "grearl-iq1s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", nargs="?", type=Path, help="where the twin is (or goes)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs of ours (best is kept)")
    args = parser.parse_args(argv)

    import gguf

    from k3desk.core.catalog.loader import load_catalog
    from k3desk.core.gguf.validate import validate_shard_set
    from k3desk.core.resources import resources_dir
    from k3desk.devtools.twin import write_twin

    tier = load_catalog(resources_dir() / "catalog.json").get(TIER)
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="k3-bench-")
        directory = Path(tmp.name)
    else:
        directory = args.dir
    first = directory / tier.first_shard
    if first.exists():
        print(f"reusing {directory}")
        parts = sorted(directory.glob("Kimi-K3-IQ1_S-*-of-00094.gguf"))
    else:
        t0 = time.perf_counter()
        parts = write_twin(tier, directory)
        print(f"wrote the {len(parts)}-part twin in {time.perf_counter() - t0:.2f} s")

    validate_shard_set(first)  # warm the page cache, as right after a download
    ours = float("inf")
    for _ in range(args.runs):
        t0 = time.perf_counter()
        layout = validate_shard_set(first)
        ours = min(ours, time.perf_counter() - t0)

    t0 = time.perf_counter()
    n_tensors = 0
    for p in parts:
        reader = gguf.GGUFReader(p)
        n_tensors += len(reader.tensors)
    theirs = time.perf_counter() - t0

    assert n_tensors == layout.tensor_count, (n_tensors, layout.tensor_count)
    print(f"files: {len(parts)}, tensors: {layout.tensor_count:,}")
    print(f"k3desk validate_shard_set : {ours:.3f} s (best of {args.runs})")
    print(f"gguf.GGUFReader x {len(parts)}     : {theirs:.3f} s")
    print(f"ratio                     : {theirs / ours:.0f}x faster")
    ok = ours <= 0.3 and theirs / ours >= 10
    print("goal (<= 0.3 s and >= 10x):", "met" if ok else "NOT met")
    if tmp is not None:
        tmp.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
