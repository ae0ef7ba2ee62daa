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

import bisect
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
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


# A routed expert's matrices (MUL_MAT_ID) for an expert type whose curve was not
# measured: the measured type with the same kernels.  From 8 tokens per expert on,
# llama.cpp multiplies an expert with its tiled matrix-matrix kernel where the type
# has one (the k-quants Q2_K..Q6_K, IQ1_S/M, the IQ2/IQ3 grids, IQ4_XS:
# ggml_tiled_supported in ggml/src/ggml-cpu/tiled/tiled.cpp, b11434), below 8 with
# the matrix-vector kernel one token at a time; the others (Q8_0, the legacy 32-blocks,
# MXFP4, F16, BF16, F32) always with the matrix-vector kernel: MUL_MAT_ID has no
# llamafile/tinyBLAS path (ggml_compute_forward_mul_mat_id, ggml-cpu.c), so an F16
# expert never gets the tiled F16 GEMM a dense F16 matrix of a prompt does.
TILED_MIN_TOKENS = 8  # ggml_tiled_min_batch: rows >= 8
TILED_TYPES = frozenset({
    "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S",
    "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
})  # fmt: skip
ROUTED_SIMILAR: dict[str, str] = {
    "Q2_K": "Q3_K",
    "Q4_K": "Q3_K",
    "Q5_K": "Q3_K",
    "Q6_K": "Q3_K",
    "IQ2_XS": "IQ2_XXS",
    "IQ2_S": "IQ2_XXS",
    "IQ3_XXS": "IQ2_XXS",
    "IQ3_S": "IQ2_XXS",
    "IQ4_XS": "IQ2_XXS",
    "Q4_0": "Q8_0",
    "Q4_1": "Q8_0",
    "Q5_0": "Q8_0",
    "Q5_1": "Q8_0",
    "IQ4_NL": "Q8_0",
    "MXFP4": "Q8_0",
    "F16": "Q8_0",
    "BF16": "F16",
    "F32": "F16",
}


@dataclass(frozen=True)
class TypeCost:
    tg_ns: float  # ns per weight per thread, one token (matrix-vector)
    pp_ns: float  # ns per weight per token per thread, a prompt batch (matrix-matrix)


# A type the CPU check did not time takes the factor of a timed type with the same
# kernel (BF16 and F32: the float path of F16), else the general factor (timed on
# Q8_0).  Not the k-quants as one family: on one machine Q4_K ran 1.5x the shipped
# costs' speed while Q3_K held them within a few per cent (a Q3_K model predicted with
# Q4_K's factor came out 28-45 % fast), so each k-quant is its own.
SCALE_FAMILY: dict[str, str] = {
    "BF16": "F16",
    "F32": "F16",
}


def _by_threads(table: Mapping[int, float], threads: int) -> float:
    """``table`` (thread count -> factor) at ``threads``: linear between the counts
    measured, the nearest count outside them (1.0 for an empty table)."""
    if not table:
        return 1.0
    known = sorted(table)
    if threads <= known[0]:
        return table[known[0]]
    if threads >= known[-1]:
        return table[known[-1]]
    i = bisect.bisect_left(known, threads)
    lo, hi = known[i - 1], known[i]
    w = (threads - lo) / (hi - lo)
    return table[lo] * (1.0 - w) + table[hi] * w


@dataclass(frozen=True)
class KernelScale:
    """How much slower (> 1) or faster (< 1) this machine's CPU runs the engine's
    kernels than the machine the costs were measured on, by test ("tg": decoding,
    matrix-vector; "pp": prompts, matrix-matrix) and thread count: ``factors`` for
    every cost (the graph's nodes, the layers' own operations, every matrix type), and
    ``types`` for the matrix types timed on their own (and their kernel family,
    ``SCALE_FAMILY``).

    Machines sold under one CPU name differ by two times and more (a cloud "AMD EPYC"
    of one generation or another, a different clock), and not by the same factor for
    every type, so a cost file measured on one of them predicts another only after a
    short run of the same kernels there (:mod:`k3desk.core.tuning.cpuprobe`).  Between
    the thread counts measured the factor is linear in the threads; outside them, that
    of the nearest count."""

    factors: Mapping[str, Mapping[int, float]]
    note: str = ""  # how it was measured, for the prediction's source line
    types: Mapping[str, Mapping[str, Mapping[int, float]]] = field(default_factory=dict)

    def __hash__(self) -> int:
        def frozen(t: Mapping[str, Mapping[int, float]]) -> tuple[object, ...]:
            return tuple((k, tuple(sorted(v.items()))) for k, v in sorted(t.items()))

        types = tuple((name, frozen(t)) for name, t in sorted(self.types.items()))
        return hash((frozen(self.factors), types, self.note))

    def at(self, test: str, threads: int) -> float:
        """The general factor (every cost without a type of its own)."""
        return _by_threads(self.factors.get(test) or {}, threads)

    def type_at(self, type_name: str, test: str, threads: int) -> float:
        """The factor of matrices of ``type_name``: its own where it was timed, else its
        family's, else the general one."""
        name = type_name.upper()
        table = self.types.get(name) or self.types.get(SCALE_FAMILY.get(name, ""))
        if table and table.get(test):
            return _by_threads(table[test], threads)
        return self.at(test, threads)


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
    # a routed expert's matrices: ns per weight per token per thread when the expert
    # multiplies n tokens, by thread count, type and n (bench/kernel_costs.py)
    routed: dict[int, dict[str, dict[int, float]]] = field(default_factory=dict)
    # this machine against the one measured (None: the costs as measured)
    scale: KernelScale | None = None

    def scaled(self, scale: KernelScale | None) -> Kernels:
        """These costs on a machine that runs the kernels ``scale`` times as long."""
        if scale is None:
            return self
        source = self.source + (f"; {scale.note}" if scale.note else "")
        return replace(self, scale=scale, source=source)

    def _factor(self, test: str, threads: int, type_name: str = "") -> float:
        if self.scale is None:
            return 1.0
        if type_name:
            return self.scale.type_at(type_name, test, threads)
        return self.scale.at(test, threads)

    def routed_cost(self, type_name: str, tokens: int, threads: int = 1) -> float | None:
        """ns per weight per token per thread of a routed expert of ``type_name`` that
        multiplies ``tokens`` tokens (None: no curve measured for it or a similar type).

        Between the measured token counts, linear; beyond the largest, ``a + b / n``
        through the two largest.  A type without its own curve follows the curve of
        the type with the same kernels (``ROUTED_SIMILAR``), scaled by the two types'
        own measured costs: matrix-vector below ``TILED_MIN_TOKENS`` and for a type
        without a tiled kernel (it stays on the matrix-vector kernel at any count: its
        dense prompt cost, tinyBLAS's for F16, says nothing of its routed cost),
        matrix-matrix from there on."""
        if not self.routed:
            return None
        at = [n for n in self.routed if n <= threads]
        table = self.routed[max(at) if at else min(self.routed)]
        name = type_name.upper()
        # the kernel that runs it: matrix-vector ("tg") or tiled matrix-matrix ("pp")
        kind = "tg" if tokens < TILED_MIN_TOKENS or name not in TILED_TYPES else "pp"
        ratio = 1.0
        if name not in table:
            other = ROUTED_SIMILAR.get(name)
            while other is not None and other not in table:  # BF16 -> F16 -> Q8_0
                other = ROUTED_SIMILAR.get(other)
            if other is None:
                return None
            # each with its own type's factor, so the curve borrowed takes its own below
            mine, _ = self.cost(name, threads)
            theirs, _ = self.cost(other, threads)
            if kind == "tg":
                ratio = mine.tg_ns / theirs.tg_ns if theirs.tg_ns > 0 else 1.0
            else:
                ratio = mine.pp_ns / theirs.pp_ns if theirs.pp_ns > 0 else 1.0
            name = other
        return ratio * self._factor(kind, threads, name) * _interpolate(table[name], tokens)

    def routed_ns(
        self, type_name: str, batch: float, frac: float, threads: int = 1
    ) -> float | None:
        """The routed experts' ns per weight per token per thread in a batch of ``batch``
        tokens each routed to a share ``frac`` of the experts.

        An expert gets n of the batch's tokens with n ~ Binomial(batch, frac) (a router
        that favours none), and costs n tokens at its n-token cost, so per token the
        cost is ``E[n c(n)] / E[n]``: a batch whose experts get few tokens each pays the
        matrix-vector cost for most of them."""
        b = max(1, round(batch))
        f = min(max(frac, 0.0), 1.0)
        if f <= 0.0:
            return None
        if f >= 1.0:
            return self.routed_cost(type_name, b, threads)
        mean = b * f
        top = min(b, math.ceil(mean + 12.0 * math.sqrt(mean * (1.0 - f)) + 12.0))
        log_p = b * math.log1p(-f)  # P(n = 0)
        odds = math.log(f) - math.log1p(-f)
        total = 0.0
        for n in range(1, top + 1):
            log_p += math.log(b - n + 1) - math.log(n) + odds
            c = self.routed_cost(type_name, n, threads)
            if c is None:
                return None
            total += math.exp(log_p) * n * c
        return total / mean

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
            return self._scaled(table[name], threads, name), ""
        other = SIMILAR.get(name)
        if other and other in table:
            note = "" if name == "F32" else f"{name} costed as {other} (not measured)"
            return self._scaled(table[other], threads, name), note
        # nothing known: the dearest measured type (a slow guess rather than a fast one)
        worst = max(table, key=lambda k: table[k].tg_ns)
        return self._scaled(table[worst], threads, name), f"{name} costed as {worst} (not measured)"

    def _scaled(self, c: TypeCost, threads: int, type_name: str) -> TypeCost:
        if self.scale is None:
            return c
        tg, pp = self._factor("tg", threads, type_name), self._factor("pp", threads, type_name)
        return TypeCost(c.tg_ns * tg, c.pp_ns * pp)

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
        return self._node_seconds(test, threads) * self._factor(test, threads)

    def _node_seconds(self, test: str, threads: int) -> float:
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
        scale = state / self.kda_state * self._factor(test, threads)
        if threads in table:
            return table[threads] * scale
        known = max(n for n in table if n <= threads) if min(table) <= threads else min(table)
        return table[known] * known / threads * scale

    def nodes(self, kind: str) -> float:
        return self.graph_nodes.get(kind, 0.0)


def _interpolate(curve: dict[int, float], tokens: int) -> float:
    """``curve`` (tokens -> cost) at ``tokens``: linear between the measured points, the
    first below them, ``a + b / n`` through the last two above them."""
    xs = sorted(curve)
    if tokens <= xs[0]:
        return curve[xs[0]]
    if tokens >= xs[-1]:
        if len(xs) < 2 or tokens == xs[-1]:
            return curve[xs[-1]]
        n1, n2 = xs[-2], xs[-1]
        b = (curve[n1] - curve[n2]) / (1.0 / n1 - 1.0 / n2)
        a = curve[n2] - b / n2
        return max(a + b / tokens, 0.0)
    i = bisect.bisect_left(xs, tokens)
    if xs[i] == tokens:
        return curve[tokens]
    lo, hi = xs[i - 1], xs[i]
    w = (tokens - lo) / (hi - lo)
    return curve[lo] * (1.0 - w) + curve[hi] * w


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
        routed_raw = data.get("routed_ns") or {}
        assert isinstance(routed_raw, dict)
        routed = {
            int(n): {
                str(t).upper(): {int(k): float(v) for k, v in curve.items()}
                for t, curve in table.items()
                if curve
            }
            for n, table in routed_raw.items()
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
        routed,
    )


@lru_cache(maxsize=4)
def _load(path: Path) -> Kernels:
    return parse(json.loads(path.read_text(encoding="utf-8")), str(path))


def load(path: Path | None = None) -> Kernels:
    """The shipped measurements (``resources/kernels.json``), read once."""
    return _load(path or resources_dir() / KERNELS_FILE)
