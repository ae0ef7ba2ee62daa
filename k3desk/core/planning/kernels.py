"""Measured CPU kernel costs and graph sizes the speed model rests on.

``resources/kernels.json`` is written by ``bench/kernel_costs.py``, which
measures them with llama.cpp's own kernels (``llama-bench`` on single-type
models) and counts llama.cpp's own graph nodes; the file says on which machine,
engine build and day, and at what load average.  Nothing in it is fitted to
the model cards or to the K3 runs ``bench/speed_vs_measured.py`` checks against.

Types the bench does not measure borrow the cost of the measured type closest
in how it decodes (``SIMILAR``), and say so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from k3desk.core.resources import resources_dir

KERNELS_FILE = "kernels.json"

# Unmeasured type -> measured type with the same decoding work per weight: the
# legacy 32-blocks decode like IQ4_NL / Q8_0, the IQ2/IQ3 grids like IQ2_XXS,
# BF16 like F16 (widened, not looked up).  F32 matrices (the router) are few and
# small; they are read at F16's per-weight cost (and their 4 bytes per weight
# through the bandwidth bound).
SIMILAR: dict[str, str] = {
    "Q4_0": "IQ4_NL",
    "Q4_1": "IQ4_NL",
    "Q5_0": "Q5_K",
    "Q5_1": "Q5_K",
    "MXFP4": "IQ4_NL",
    "IQ2_XS": "IQ2_XXS",
    "IQ2_S": "IQ2_XXS",
    "IQ3_XXS": "IQ2_XXS",
    "IQ3_S": "IQ2_XXS",
    "TQ1_0": "IQ1_S",
    "TQ2_0": "Q2_K",
    "BF16": "F16",
    "F32": "F16",
}


@dataclass(frozen=True)
class TypeCost:
    tg_ns: float  # ns per weight per thread, one token (matrix-vector)
    pp_ns: float  # ns per weight per token per thread, a prompt batch (matrix-matrix)


@dataclass(frozen=True)
class Kernels:
    source: str
    types: dict[str, TypeCost]
    # seconds per graph node per token, by thread count, for "tg" and "pp"
    node_s: dict[str, dict[int, float]]
    # graph nodes: "global", "kda", "mla", "dense", "moe" (per layer of that kind)
    graph_nodes: dict[str, float]
    load_average: tuple[float, ...] = field(default_factory=tuple)
    pp_tokens: int = 64  # the prompt length the "pp" figures were measured with
    # a KDA layer's own operations (recurrence, convolutions, norms, gates) per token,
    # by test and thread count, measured at a state of ``kda_state`` = heads x d_k x d_v
    kda_layer_s: dict[str, dict[int, float]] = field(default_factory=dict)
    kda_state: int = 0
    # the same per-type costs measured with more threads (``types_at_N_threads``): the
    # cost per weight per thread grows when the cores share a physical core or a cache
    types_at: dict[int, dict[str, TypeCost]] = field(default_factory=dict)

    def cost(self, type_name: str, threads: int = 1) -> tuple[TypeCost, str]:
        """The cost of ``type_name`` per weight per thread with ``threads`` threads, and
        a note when it is borrowed from another type.

        Measured at the largest thread count measured that is not above ``threads``
        (beyond the counts measured, the per-thread cost stays that of the largest)."""
        table = self.types
        at = [n for n in self.types_at if n <= threads]
        if at:
            wider = self.types_at[max(at)]
            table = {**self.types, **wider}
        name = type_name.upper()
        if name in table:
            return table[name], ""
        other = SIMILAR.get(name)
        if other and other in table:
            note = "" if name == "F32" else f"{name} costed as {other} (not measured)"
            return table[other], note
        # nothing known: the dearest measured type (a slow guess rather than a fast one)
        worst = max(table, key=lambda k: table[k].tg_ns)
        return table[worst], f"{name} costed as {worst} (not measured)"

    def batch_ns(self, type_name: str, tokens: float, threads: int = 1) -> float:
        """ns per weight per token per thread of one matrix multiplied by ``tokens`` tokens.

        A matrix costs a part per weight paid once per multiplication (reading and
        unpacking its blocks) and a part per weight and token (the dot products); the two
        measured points, one token (``tg_ns``) and a ``pp_tokens`` batch (``pp_ns``), give
        both: ``cost(n) = per_token + once / n``.  A routed expert in a prompt sees only
        the few tokens routed to it, so its cost per token sits between the two."""
        c, _ = self.cost(type_name, threads)
        n_pp = max(float(self.pp_tokens), 2.0)
        once = max(c.tg_ns - c.pp_ns, 0.0) * n_pp / (n_pp - 1.0)
        per_token = c.pp_ns - once / n_pp
        return per_token + once / max(tokens, 1.0)

    def node_seconds(self, test: str, threads: int) -> float:
        """Per-node overhead at ``threads``: measured where it was, else extrapolated.

        Every thread passes each node's barrier through one shared counter
        (``ggml_barrier`` in ggml-cpu.c: one ``atomic_fetch_add`` per thread on the same
        cache line; libgomp's centralised barrier in an OpenMP build, as the PyPI engine
        is), so a barrier costs about as much per thread as passes it: linear in the
        thread count.  With one thread there is no barrier at all (``ggml_barrier``: ``if
        (n_threads == 1) return;``), so where only one count of two or more was measured
        (a two-core machine), the barrier's part is what that count adds to one thread's
        figure, and it grows in proportion to the threads; with two or more such counts,
        the line through the two largest."""
        table = self.node_s.get(test) or {}
        if not table:
            return 0.0
        if threads in table:
            return table[threads]
        known = sorted(table)
        if threads < known[-1]:
            below = [n for n in known if n <= threads]
            return table[below[-1]] if below else table[known[0]]
        multi = [n for n in known if n >= 2]
        if len(multi) >= 2:
            a, b = multi[-2], multi[-1]
            slope = max((table[b] - table[a]) / (b - a), 0.0)
            return table[b] + slope * (threads - b)
        if multi and 1 in table:
            m = multi[-1]
            barrier = max(table[m] - table[1], 0.0)
            return table[1] + barrier * threads / m
        return table[known[-1]]

    def kda_seconds(self, test: str, threads: int, state: int) -> float:
        """One KDA layer's own operations per token with a state of ``state`` elements:
        the measured time, scaled by the state (the recurrence's work grows with it) and,
        beyond the thread counts measured, divided among the threads."""
        table = self.kda_layer_s.get(test) or {}
        if not table or self.kda_state <= 0:
            return 0.0
        scale = state / self.kda_state
        if threads in table:
            return table[threads] * scale
        known = max(n for n in table if n <= threads) if min(table) <= threads else min(table)
        return table[known] * known / threads * scale

    def nodes(self, kind: str) -> float:
        return self.graph_nodes.get(kind, 0.0)


def parse(data: dict[str, object], where: str = KERNELS_FILE) -> Kernels:
    try:
        types_raw = data["types"]
        node_raw = data["node_s"]
        nodes_raw = data["graph_nodes"]
        assert isinstance(types_raw, dict)
        assert isinstance(node_raw, dict)
        assert isinstance(nodes_raw, dict)
        types = {
            str(k).upper(): TypeCost(float(v["tg_ns"]), float(v["pp_ns"]))
            for k, v in types_raw.items()
        }
        node_s = {
            str(test): {int(n): float(s) for n, s in table.items()}
            for test, table in node_raw.items()
        }
        nodes = {str(k): float(v) for k, v in nodes_raw.items()}
        loads = data.get("load_average") or []
        assert isinstance(loads, list)
        tests = data.get("tests") or {}
        assert isinstance(tests, dict)
        pp_tokens = int(tests.get("pp", 64))
        kda_raw = data.get("kda_layer_s") or {}
        assert isinstance(kda_raw, dict)
        kda = {
            str(test): {int(n): float(v) for n, v in table.items()}
            for test, table in kda_raw.items()
        }
        kda_state = int(str(data.get("kda_state", 0)))
        types_at: dict[int, dict[str, TypeCost]] = {}
        for key, table in data.items():
            m = re.fullmatch(r"types_at_(\d+)_threads", key)
            if m is None or int(m.group(1)) <= 1:
                continue
            assert isinstance(table, dict)
            types_at[int(m.group(1))] = {
                str(k).upper(): TypeCost(float(v["tg_ns"]), float(v["pp_ns"]))
                for k, v in table.items()
            }
    except (KeyError, TypeError, ValueError, AssertionError, AttributeError) as exc:
        raise ValueError(f"{where} is malformed: {exc!r}") from exc
    if not types:
        raise ValueError(f"{where} lists no kernel costs")
    load = (
        "load average " + "/".join(f"{float(x):.2f}" for x in loads)
        if loads
        else "load average not recorded"
    )
    source = (
        f"measured by bench/kernel_costs.py on {data.get('machine', '?')}, "
        f"{data.get('engine', '?')}, {data.get('date', '?')}, {load}"
    )
    return Kernels(
        source,
        types,
        node_s,
        nodes,
        tuple(float(x) for x in loads),
        pp_tokens,
        kda,
        kda_state,
        types_at,
    )


@lru_cache(maxsize=4)
def _load(path: Path) -> Kernels:
    return parse(json.loads(path.read_text(encoding="utf-8")), str(path))


def load(path: Path | None = None) -> Kernels:
    """The shipped measurements (``resources/kernels.json``), read once."""
    return _load(path or resources_dir() / KERNELS_FILE)
