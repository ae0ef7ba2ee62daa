"""How fast, and in how little memory, k3desk refuses hostile GGUF headers.

    python bench/hostile_headers.py

Builds each file of tests/oracle/hostile.py (huge counts, scalar-vs-array
per-layer keys, sparse files with 900 MiB strings, ...) and runs the real
``k3desk validate`` on it in a fresh process, next to the anchor: the same
command on the valid tiny model the hostile files are made from.  Reports the
validation time (in this process) and the command's peak RSS for each.

Goal: every file refused (exit 1, one message, no traceback) in <= 1 s and
<= 64 MiB peak RSS.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    from k3desk.core.engines.canary import write_k3_gguf
    from k3desk.core.errors import ValidationError
    from k3desk.core.gguf.validate import inspect_shard_set
    from k3desk.core.k3arch import TINY_K3
    from tests.oracle.hostile import HOSTILE, MAX_RSS, MAX_SECONDS, run_cli

    ok = True
    with tempfile.TemporaryDirectory(prefix="k3-hostile-") as tmp:
        root = Path(tmp)
        (tiny,) = write_k3_gguf(root / "tiny", "Tiny-K3", shape=TINY_K3)
        t0 = time.perf_counter()
        inspect_shard_set(tiny)
        anchor_s = time.perf_counter() - t0
        rc, _, _, anchor_rss = run_cli(tiny)
        print(f"{'file':52} {'validate':>9} {'peak RSS':>9}  exit")
        label = "anchor: the valid tiny model"
        print(f"{label:52} {anchor_s:8.3f}s {anchor_rss / 2**20:7.1f}MiB  {rc}")
        worst_s = worst_rss = 0.0
        for i, (name, (build, phrase)) in enumerate(HOSTILE.items()):
            d = root / f"{i:02d}"
            d.mkdir()
            path = build(tiny, d)
            t0 = time.perf_counter()
            try:
                inspect_shard_set(path)
                refused = False
            except ValidationError as exc:
                refused = phrase in exc.message
            seconds = time.perf_counter() - t0
            rc, out, err, rss = run_cli(path)
            good = (
                refused and rc == 1 and not out and "Traceback" not in err
                and len(err.splitlines()) == 2
                and seconds <= MAX_SECONDS and rss <= MAX_RSS
            )  # fmt: skip
            ok = ok and good
            worst_s, worst_rss = max(worst_s, seconds), max(worst_rss, rss)
            print(
                f"{name:52} {seconds:8.3f}s {rss / 2**20:7.1f}MiB  {rc}{'' if good else '  FAIL'}"
            )
            for p in d.iterdir():
                p.unlink()
    worst = f"worst {worst_s:.3f} s, {worst_rss / 2**20:.1f} MiB peak RSS"
    print(f"\n{len(HOSTILE)} hostile files: {worst}")
    print(f"goal (each refused, <= {MAX_SECONDS:.0f} s, <= 64 MiB):", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
