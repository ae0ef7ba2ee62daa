"""The CPU costs the speed model uses, measured with the engine's own kernels.

    python bench/kernel_costs.py            # measure, print, and write resources/kernels.json
    python bench/kernel_costs.py --print    # print what resources/kernels.json holds

What it measures (``llama-bench``, on a quiet machine, in ``--rounds`` rounds: every
model once per round, the median of the rounds, so that a cost and the runs it is
checked against do not each catch the machine at one moment; see
``k3desk/devtools/measure.py``):

* **per-type cost**: for each ggml type the tiers use, a dense kimi-k3 model
  whose every matrix is that type (``llama-quantize --pure``, about 0.6 G
  weights: far more than any cache) decodes ``tg`` tokens and processes a ``pp``
  prompt on one thread.  The time per token, less the graph overhead measured
  below, divided by the weights of that type, is the type's cost in ns per weight
  per thread, for decoding (one token: matrix-vector) and for prompts (a batch of
  tokens: matrix-matrix).  The same is measured with every core as a check that
  the cost scales with threads (where it does not, memory bandwidth binds);
* **graph overhead**: two tiny (64-wide) kimi-k3 models of 8 and 48 layers, whose
  weights are negligible: the time per token that grows with the layers, divided
  by the graph nodes that grow with them, is the cost of one graph node (the
  threads' start and barrier), per thread count;
* **routed experts** (``MUL_MAT_ID``): llama.cpp multiplies an expert that few
  tokens of a batch route to with the matrix-vector kernel, one token at a
  time, and switches to a tiled matrix-matrix kernel from 8 tokens on
  (``ggml_tiled_min_batch``, ggml/src/ggml-cpu/tiled/tiled.cpp in b11434; Q8_0,
  which has no tiled kernel, stays on the matrix-vector one).  So the cost per
  weight per token of a routed expert depends on how many tokens it gets, and is
  measured at 1 to 128 tokens: two kimi-k3 models of 8 experts that every token
  uses all of (in a prompt of P tokens each expert multiplies exactly P), which
  differ only in the experts' width; the difference of their time per token,
  divided by the difference of their expert weights, is the cost at P tokens;
* **graph nodes**: llama.cpp's own count (``sched_reserve: graph: nodes = N``)
  for tiny models of every layer mix, solved for the nodes per KDA layer, MLA
  layer, dense FFN and MoE FFN.

Nothing here uses the K3 bench models ``bench/speed_vs_measured.py`` checks
against: those runs stay held out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from k3desk.core.engines.canary import write_k3_gguf  # noqa: E402
from k3desk.core.gguf.validate import validate_shard_set  # noqa: E402
from k3desk.core.hardware.detect import detect_hardware  # noqa: E402
from k3desk.core.k3arch import TINY_K3, is_expert_tensor  # noqa: E402
from k3desk.core.planning import kernels  # noqa: E402
from k3desk.devtools.benchk3 import (  # noqa: E402
    DEFAULT_CACHE,
    KERNEL_SHAPE,
    KERNEL_TYPES,
    MOE_KERNEL_TYPES,
    build_kernel_model,
    engine_build,
)
from k3desk.devtools.measure import (  # noqa: E402
    BenchResult,
    default_bin,
    in_rounds,
    llama_bench,
    load_average,
    repetitions_per_round,
    wait_quiet,
)

OUT = REPO / "resources" / "kernels.json"
TG, PP = 32, 64
OVERHEAD_LAYERS = (8, 48)
ABOUT = (
    "CPU costs measured with the engine's own kernels by bench/kernel_costs.py: ns "
    "per weight per thread for decoding (tg, matrix-vector) and prompts (pp, a batch "
    "of tokens), on one thread; the per-node graph overhead and a KDA layer's own "
    "operations (recurrence, norms, activations) per thread count; graph nodes per "
    "layer kind from llama.cpp's own count; routed_ns: a routed expert's ns per "
    "weight per token per thread when it multiplies n tokens (MUL_MAT_ID), by "
    "thread count, type and n."
)
# tokens per routed expert measured: around llama.cpp's switch at 8 and up to a
# 128-token batch (see the module docstring)
ROUTED_TOKENS = (1, 2, 4, 7, 8, 12, 16, 32, 64, 128)


def timed(
    bin_dir: Path,
    models: dict[Any, Path],
    threads: int,
    args: argparse.Namespace,
    repetitions: int,
    n_prompt: int | Sequence[int] = PP,
    n_gen: int = TG,
) -> dict[Any, dict[str, tuple[float, float]]]:
    """Seconds per token and spread, by test ("tg", "pp", or "pp<n>" for several
    prompt lengths), of every model, measured in ``args.rounds`` rounds (each round
    after waiting for a quiet machine)."""
    reps = repetitions_per_round(repetitions, args.rounds)

    def job(path: Path) -> Callable[[], list[BenchResult]]:
        return lambda: llama_bench(
            bin_dir, path, threads=threads, n_prompt=n_prompt, n_gen=n_gen, repetitions=reps
        )

    def quiet(i: int) -> None:
        load = wait_quiet(args.max_load, args.max_wait)
        print(f"  round {i + 1} of {args.rounds}, {threads} thread(s) (load average {load:.2f})")

    runs = in_rounds({k: job(p) for k, p in models.items()}, args.rounds, quiet)
    several = not isinstance(n_prompt, int)
    return {
        k: {(r.test if several else r.test[:2]): (1.0 / r.median_tps, r.spread) for r in res}
        for k, res in runs.items()
    }


def graph_nodes(bin_dir: Path, model: Path) -> int:
    """llama.cpp's node count for ``model``'s graph (``llama-completion -v``)."""
    argv = [
        str(bin_dir / "llama-completion"), "-m", str(model), "-n", "1", "-p", "hi", "-no-cnv",
        "-t", "1", "-c", "256", "--no-warmup", "-fa", "on", "-v",
    ]  # fmt: skip
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        errors="replace",
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    found = re.findall(r"graph: (?:\(.*?\) )?nodes = (\d+)", out.stdout + out.stderr)
    if not found:
        raise RuntimeError(f"no node count in llama-completion's log for {model}")
    return int(found[-1])


def count_nodes(bin_dir: Path, work: Path) -> dict[str, float]:
    """Nodes per KDA / MLA layer, per dense / MoE FFN, and outside the layers."""
    rows, counts = [], []
    for n_layer in (4, 6, 8, 13):
        for mla_every in (1, 2, 3, 100):
            for dense, used in ((1, 2), (2, 2), (1, 4)):
                s = replace(
                    TINY_K3,
                    n_layer=n_layer,
                    mla_every=mla_every,
                    n_dense_lead=dense,
                    n_expert_used=used,
                )
                n_mla = sum(s.is_mla(i) for i in range(n_layer))
                tag = f"n{n_layer}-m{mla_every}-d{dense}-k{used}"
                path = write_k3_gguf(work / tag, "m", shape=s)[0]
                counts.append(graph_nodes(bin_dir, path))
                n_moe = n_layer - dense
                rows.append([1, n_layer - n_mla, n_mla, dense, n_moe, n_moe * used])
    a, y = np.array(rows, float), np.array(counts, float)
    x, *_ = np.linalg.lstsq(a, y, rcond=None)
    worst = float(np.abs(a @ x - y).max())
    print(f"graph nodes: {len(y)} models, worst residual {worst:.2f} nodes")
    names = ("global", "kda", "mla", "dense", "moe", "moe_per_used")
    return {k: round(float(v), 2) for k, v in zip(names, x, strict=True)}


def graph_total(
    nodes: dict[str, float], n_layer: int, n_mla: int, n_dense: int, used: int = 2
) -> float:
    """Graph nodes of a model of ``n_layer`` layers (``n_mla`` MLA, ``n_dense`` dense FFN)."""
    moe = nodes["moe"] + used * nodes["moe_per_used"]
    return (
        nodes["global"] + (n_layer - n_mla) * nodes["kda"] + n_mla * nodes["mla"]
        + n_dense * nodes["dense"] + (n_layer - n_dense) * moe
    )  # fmt: skip


def weights_by_type(model: Path) -> tuple[dict[str, int], int]:
    """Weights read per token, by type (token_embd is one row: left out); node count."""
    layout = validate_shard_set(model)
    out: dict[str, int] = {}
    for t in layout.tensors:
        if t.name.startswith("token_embd"):
            continue
        out[t.type_name] = out.get(t.type_name, 0) + math.prod(t.shape)
    return out, len(layout.layers)


def expert_weights(model: Path) -> int:
    """Weights of the routed-expert tensors of ``model``."""
    layout = validate_shard_set(model)
    return sum(math.prod(t.shape) for t in layout.tensors if is_expert_tensor(t.name))


def measure_routed(
    bin_dir: Path,
    args: argparse.Namespace,
    thread_counts: Sequence[int],
    types: Sequence[str] = MOE_KERNEL_TYPES,
) -> tuple[dict[str, dict[str, dict[str, float]]], list[float]]:
    """ns per weight per token per thread of a routed expert's matrices at each of
    ``ROUTED_TOKENS`` tokens, per thread count and type (see the module docstring)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    loads: list[float] = []
    models = {
        t: (
            build_kernel_model(t, bin_dir, args.cache, progress=print, moe=True),
            build_kernel_model(t, bin_dir, args.cache, progress=print, moe=True, narrow=True),
        )
        for t in types
    }
    for threads in thread_counts:
        load = load_average()
        loads.append(load)
        print(f"routed experts, threads {threads} (load average {load:.2f})")
        paths: dict[Any, Path] = {}
        for qtype, (wide, narrow) in models.items():
            paths[(qtype, "wide")], paths[(qtype, "narrow")] = wide, narrow
        times = timed(bin_dir, paths, threads, args, 3, n_prompt=ROUTED_TOKENS, n_gen=0)
        table: dict[str, dict[str, float]] = {}
        for qtype, (wide, narrow) in models.items():
            dw = expert_weights(wide) - expert_weights(narrow)
            t_wide, t_narrow = times[(qtype, "wide")], times[(qtype, "narrow")]
            spread = max(x[1] for x in (*t_wide.values(), *t_narrow.values()))
            row = {
                str(n): round(
                    max(t_wide[f"pp{n}"][0] - t_narrow[f"pp{n}"][0], 0.0) / dw * threads * 1e9, 5
                )
                for n in ROUTED_TOKENS
            }
            table[qtype] = row
            print(
                f"  {qtype:8s} "
                + " ".join(f"{n}:{row[str(n)]:.4f}" for n in ROUTED_TOKENS)
                + f" ns/weight/token/thread (spread {spread:.0%})"
            )
        out[str(threads)] = table
    return out, loads


def _costs(k: kernels.Kernels | None, type_name: str, test: str) -> float:
    """ns per weight of ``type_name`` from what is measured so far (0 if nothing)."""
    if k is None:
        return 0.0
    c, _ = k.cost(type_name)
    return c.tg_ns if test == "tg" else c.pp_ns


def measure(args: argparse.Namespace) -> int:
    bin_dir = args.engine_bin or default_bin()
    cache = args.cache
    work = cache / "kernel-tiny"
    hw = detect_hardware(measure_bandwidth=False)
    cores = hw.cpu.physical_cores
    thread_counts = sorted({1, cores})
    nodes = count_nodes(bin_dir, work / "nodes")
    print("nodes:", nodes)

    only = set(args.only) if args.only else None
    dense_types = [t for t in KERNEL_TYPES if only is None or t in only or t == "Q8_0"]
    models = {t: build_kernel_model(t, bin_dir, cache, progress=print) for t in dense_types}
    narrow = build_kernel_model("Q8_0", bin_dir, cache, progress=print, narrow=True)
    tiny = {
        n: write_k3_gguf(work / f"L{n}", f"L{n}", shape=replace(TINY_K3, n_layer=n, mla_every=4))[0]
        for n in OVERHEAD_LAYERS
    }

    def node_total(n_layer: int, n_mla: int, n_dense: int, used: int = 2) -> float:
        return graph_total(nodes, n_layer, n_mla, n_dense, used)

    shape = KERNEL_SHAPE
    n_kda = sum(1 for i in range(shape.n_layer) if not shape.is_mla(i))
    kernel_nodes = node_total(shape.n_layer, shape.n_layer - n_kda, shape.n_layer)
    loads: list[float] = []
    node_s: dict[str, dict[str, float]] = {"tg": {}, "pp": {}}
    structure: dict[str, dict[str, float]] = {"tg": {}, "pp": {}}
    costs: dict[str, dict[str, float]] = {}
    checks: dict[str, dict[str, float]] = {}

    for threads in thread_counts:
        load = wait_quiet(args.max_load, args.max_wait)
        loads.append(load)
        print(f"threads {threads} (load average {load:.2f})")
        n = str(threads)
        # every model of this thread count, in rounds
        times = timed(bin_dir, {("tiny", k): v for k, v in tiny.items()}, threads, args, 7)
        dense: dict[Any, Path] = {"narrow": narrow, **models}
        times |= timed(bin_dir, dense, threads, args, 5)
        # 1. one graph node's overhead: tiny layers, negligible weights
        per_token = {
            n_layer: {t: v[0] for t, v in times[("tiny", n_layer)].items()} for n_layer in tiny
        }
        lo, hi = OVERHEAD_LAYERS
        tiny_shape = replace(TINY_K3, mla_every=4)
        n_lo = node_total(lo, sum(replace(tiny_shape, n_layer=lo).is_mla(i) for i in range(lo)), 1)
        n_hi = node_total(hi, sum(replace(tiny_shape, n_layer=hi).is_mla(i) for i in range(hi)), 1)
        for test in ("tg", "pp"):
            dt_s = per_token[hi][test] - per_token[lo][test]
            node_s[test][n] = max(dt_s / (n_hi - n_lo), 0.0)
        # 2. Q8_0 at two FFN widths: the matrix cost, and what the layers cost besides
        wide, _ = weights_by_type(models["Q8_0"])
        slim, _ = weights_by_type(narrow)
        t_wide, t_slim = times["Q8_0"], times["narrow"]
        row_q8: dict[str, float] = {}
        for test in ("tg", "pp"):
            dw = sum(wide.values()) - sum(slim.values())
            per_weight = (t_wide[test][0] - t_slim[test][0]) / dw  # s per weight, n threads
            rest = t_wide[test][0] - per_weight * sum(wide.values())
            rest -= kernel_nodes * node_s[test][n]
            structure[test][n] = max(rest / n_kda, 0.0)
            row_q8[test] = per_weight * threads * 1e9
            row_q8[f"{test}_spread"] = max(t_wide[test][1], t_slim[test][1])
        print(
            f"  node: tg {node_s['tg'][n] * 1e6:.3f} us, pp {node_s['pp'][n] * 1e6:.4f} us "
            f"per token; KDA layer: tg {structure['tg'][n] * 1e3:.3f} ms, "
            f"pp {structure['pp'][n] * 1e3:.4f} ms per token"
        )
        measured: dict[str, dict[str, float]] = {"Q8_0": row_q8}
        # 3. every other type: what its model takes beyond nodes and layer operations
        first = ("F16", "IQ4_NL")  # the fallbacks of rows other types cannot hold
        order = [*first, *[t for t in KERNEL_TYPES if t not in ("Q8_0", *first)]]
        for qtype in [t for t in order if t in models]:
            so_far = kernels.parse(_draft(measured, node_s, structure, nodes))
            measured[qtype] = type_cost(
                models[qtype], qtype, times[qtype], threads, so_far,
                kernel_nodes * node_s["tg"][n] + n_kda * structure["tg"][n],
                kernel_nodes * node_s["pp"][n] + n_kda * structure["pp"][n],
            )  # fmt: skip
        for qtype, row in measured.items():
            print(
                f"  {qtype:8s} tg {row['tg']:.4f} ns/weight/thread, pp {row['pp']:.4f} "
                f"(spread {row['tg_spread']:.0%} / {row['pp_spread']:.0%})"
            )
            target = costs if threads == 1 else checks
            target[qtype] = {"tg_ns": round(row["tg"], 5), "pp_ns": round(row["pp"], 5)}
    routed_types = [t for t in MOE_KERNEL_TYPES if only is None or t in only]
    routed, routed_loads = measure_routed(bin_dir, args, thread_counts, routed_types)
    result = _draft(
        {k: {"tg": v["tg_ns"], "pp": v["pp_ns"]} for k, v in costs.items()},
        node_s,
        structure,
        nodes,
    )
    result |= _routed_fields(routed, routed_loads) | {
        "machine": f"{hw.cpu.model}, {cores} cores, flags {','.join(sorted(hw.cpu.flags))}",
        "platform": platform.platform(),
        "engine": engine_build(bin_dir),
        "date": dt.date.today().isoformat(),
        "load_average": [round(x, 2) for x in loads],
        f"types_at_{cores}_threads": checks,
    }
    return _write(result, args.dry_run, args.out)


def type_cost(
    model: Path,
    qtype: str,
    times: dict[str, tuple[float, float]],
    threads: int,
    so_far: kernels.Kernels,
    rest_tg: float,
    rest_pp: float,
) -> dict[str, float]:
    """ns per weight per thread of ``qtype`` from its single-type model's seconds per
    token (``times``): less what is not its matrices (``rest_*``: the graph nodes and
    the KDA layers' own operations, seconds per token) and less the few tensors of
    other types (llama-quantize's fallbacks, the F32 norms) at their costs so far."""
    w, _ = weights_by_type(model)
    row: dict[str, float] = {}
    for test, rest in (("tg", rest_tg), ("pp", rest_pp)):
        t = times[test][0] - rest
        for other, weights in w.items():
            if other != qtype:
                t -= weights * _costs(so_far, other, test) * 1e-9 / threads
        row[test] = t * threads / w[qtype] * 1e9
        row[f"{test}_spread"] = times[test][1]
    return row


def _routed_fields(
    routed: dict[str, dict[str, dict[str, float]]], loads: list[float]
) -> dict[str, object]:
    """The routed-expert part of resources/kernels.json."""
    return {
        "routed_tokens": list(ROUTED_TOKENS),
        "routed_ns": routed,
        "routed_load_average": [round(x, 2) for x in loads],
        "routed_date": dt.date.today().isoformat(),
    }


def _write(data: dict[str, object], dry_run: bool, out: Path | None = None) -> int:
    """Write resources/kernels.json or ``out`` (``dry_run``: print it instead)."""
    if dry_run:
        print(json.dumps(data, indent=2))
    else:
        target = out or OUT
        target.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {target} (load average now {load_average():.2f})")
    return 0


def _draft(
    measured: dict[str, dict[str, float]],
    node_s: dict[str, dict[str, float]],
    structure: dict[str, dict[str, float]],
    nodes: dict[str, float],
) -> dict[str, object]:
    """The resources/kernels.json form of what was measured."""
    s = KERNEL_SHAPE
    return {
        "about": ABOUT,
        "tests": {"tg": TG, "pp": PP},
        "types": {
            k: {"tg_ns": round(v["tg"], 5), "pp_ns": round(v["pp"], 5)} for k, v in measured.items()
        },
        "node_s": node_s,
        "kda_layer_s": structure,
        "kda_state": s.n_head * s.head_dim_kda * s.head_dim_kda,
        "graph_nodes": nodes,
    }


def _same_engine(bin_dir: Path) -> dict[str, Any] | None:
    """resources/kernels.json, if it was measured with this engine build (else say so)."""
    data: dict[str, Any] = json.loads(OUT.read_text(encoding="utf-8"))
    if data.get("engine") != engine_build(bin_dir):
        print(f"resources/kernels.json was measured with {data.get('engine')}, not "
              f"{engine_build(bin_dir)}: run the full measurement")  # fmt: skip
        return None
    return data


def _unknown(types: Sequence[str]) -> bool:
    """True (after saying which) when a type is not one this bench measures."""
    unknown = [t for t in types if t not in KERNEL_TYPES and t not in MOE_KERNEL_TYPES]
    if unknown:
        print(f"not a type this bench measures: {', '.join(unknown)} (dense: "
              f"{', '.join(KERNEL_TYPES)}; routed: {', '.join(MOE_KERNEL_TYPES)})")  # fmt: skip
    return bool(unknown)


def measure_routed_only(args: argparse.Namespace) -> int:
    """Add (or replace) the routed-expert costs in resources/kernels.json, keeping the rest."""
    bin_dir = args.engine_bin or default_bin()
    data = _same_engine(bin_dir)
    if data is None:
        return 1
    cores = detect_hardware(measure_bandwidth=False).cpu.physical_cores
    routed, loads = measure_routed(bin_dir, args, sorted({1, cores}))
    data |= {"about": ABOUT} | _routed_fields(routed, loads)
    return _write(data, args.dry_run, args.out)


def measure_types(args: argparse.Namespace, types: Sequence[str]) -> int:
    """Measure only ``types`` (their dense cost and, for expert types, their routed
    curve) and add them to resources/kernels.json, keeping everything else: the
    node overhead, the KDA layers' own operations and the other types' costs the
    subtraction needs are the file's, measured with the same engine."""
    bin_dir = args.engine_bin or default_bin()
    data = _same_engine(bin_dir)
    if data is None:
        return 1
    if _unknown(types):
        return 2
    cores = detect_hardware(measure_bandwidth=False).cpu.physical_cores
    thread_counts = sorted({1, cores})
    dense = [] if args.routed_only else [t for t in types if t in KERNEL_TYPES]
    models = {t: build_kernel_model(t, bin_dir, args.cache, progress=print) for t in dense}
    shape = KERNEL_SHAPE
    n_kda = sum(1 for i in range(shape.n_layer) if not shape.is_mla(i))
    kernel_nodes = graph_total(
        data["graph_nodes"], shape.n_layer, shape.n_layer - n_kda, shape.n_layer
    )
    loads = list(data.get("load_average", []))
    for threads in thread_counts if dense else ():
        so_far = kernels.parse(data)
        key = "types" if threads == 1 else f"types_at_{threads}_threads"
        load = wait_quiet(args.max_load, args.max_wait)
        loads.append(round(load, 2))
        print(f"threads {threads} (load average {load:.2f})")
        n = str(threads)
        measured = timed(bin_dir, dict(models), threads, args, 5)
        for qtype in dense:
            times = measured[qtype]
            rests = [
                kernel_nodes * data["node_s"][test][n] + n_kda * data["kda_layer_s"][test][n]
                for test in ("tg", "pp")
            ]
            row = type_cost(models[qtype], qtype, times, threads, so_far, *rests)
            print(
                f"  {qtype:8s} tg {row['tg']:.4f} ns/weight/thread, pp {row['pp']:.4f} "
                f"(spread {row['tg_spread']:.0%} / {row['pp_spread']:.0%})"
            )
            data.setdefault(key, {})[qtype] = {
                "tg_ns": round(row["tg"], 5), "pp_ns": round(row["pp"], 5)
            }  # fmt: skip
    routed_types = [] if args.dense_only else [t for t in types if t in MOE_KERNEL_TYPES]
    if routed_types:
        routed, routed_loads = measure_routed(bin_dir, args, thread_counts, routed_types)
        for at, table in routed.items():
            data.setdefault("routed_ns", {}).setdefault(at, {}).update(table)
        data["routed_load_average"] = [
            *data.get("routed_load_average", []),
            *[round(x, 2) for x in routed_loads],
        ]
    today = dt.date.today().isoformat()
    data["measured_later"] = {
        **data.get("measured_later", {}),
        **{f"{t} (dense)": today for t in dense},
        **{f"{t} (routed)": today for t in routed_types},
    }
    data["load_average"] = loads
    return _write(data, args.dry_run, args.out)


def show() -> int:
    k = kernels.load()
    print(k.source)
    for name, c in sorted(k.types.items()):
        print(f"  {name:8s} tg {c.tg_ns:.4f} ns  pp {c.pp_ns:.4f} ns per weight per thread")
    print("  node overhead (s):", k.node_s)
    print("  graph nodes:", k.graph_nodes)
    for threads, table in sorted(k.routed.items()):
        print(f"  routed experts, {threads} thread(s), ns per weight per token per thread:")
        for name, curve in sorted(table.items()):
            print(f"    {name:8s} " + " ".join(f"{n}:{c:.4f}" for n, c in sorted(curve.items())))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="show resources/kernels.json")
    parser.add_argument("--dry-run", action="store_true", help="measure, but do not write")
    parser.add_argument(
        "--routed-only",
        action="store_true",
        help="measure only the routed-expert costs and add them to resources/kernels.json",
    )
    parser.add_argument(
        "--types",
        default="",
        help="comma-separated: measure only these types (dense and routed; with "
        "--routed-only, routed only) and add them to resources/kernels.json",
    )
    parser.add_argument("--dense-only", action="store_true", help="with --types: no routed curves")
    parser.add_argument(
        "--only",
        type=lambda v: [t.strip().upper() for t in v.split(",") if t.strip()],
        default=None,
        help="the full measurement (node overhead, layers, Q8_0) for these types only: a "
        "self-consistent file for models of these types, quicker to make (use with --out)",
    )
    parser.add_argument("--out", type=Path, help="write here instead of resources/kernels.json")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--engine-bin", type=Path)
    parser.add_argument("--max-load", type=float, default=0.5)
    parser.add_argument("--max-wait", type=float, default=1800.0)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="measure every model of a step once per round, this many rounds, and keep "
        "the median (default 3; 1: one run each, as many repetitions as 3 rounds)",
    )
    args = parser.parse_args()
    if args.print:
        return show()
    if args.types:
        return measure_types(args, [t.strip().upper() for t in args.types.split(",") if t.strip()])
    if args.only and _unknown(args.only):
        return 2
    return measure_routed_only(args) if args.routed_only else measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
