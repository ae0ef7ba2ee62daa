"""The SparkInfer recipe's launch settings, read from the recipe itself.

Sources (cited by path; the recipe is vcruz305/kimi-k3-neuron-tp3-dgxspark-recipe at
``aab21c4``, its engine gittensor-ai-lab/sparkinfer-k3 v0.2.2 = ``7a9b77a`` plus the
recipe's patch chain through 0026):

* ``scripts/k3_cluster.sh``, ``worker()`` (lines 118-147): the public launcher exports, on
  every rank, ``LD_LIBRARY_PATH=$DIST:...`` (line 131), ``CUDA_VISIBLE_DEVICES=<the role's
  GPU>`` (132) and ``NCCL_NVLS_ENABLE=0 SPARKINFER_K3_MOE_WEPS=0 SPARKINFER_K3_GRAPH=0
  SPARKINFER_K3_PREFILL_CHUNK=16 SPARKINFER_K3_DIST_HEAD_BAND=1 SPARKINFER_K3_PROJ_TOKS=8``
  (133-138), and passes ``--rank --world --model --max-ctx $MAX_CTX`` (default 4096, line
  49) and ``--spec-draft $SPEC_K --spec-ngram-min 1 --spec-ngram-max $SPEC_K
  --spec-min-occur 2 --spec-majority 2/3`` (128-129; ``SPEC_K`` default 8, line 50) to every
  rank: the n-gram window follows K.  The coordinator adds ``--listen $LISTEN --serve
  $SERVE`` (140; defaults ``0.0.0.0:29500`` and ``127.0.0.1:29600``, lines 47-48), the
  others ``--coord $COORDINATOR_FABRIC:<LISTEN's port>`` (142).
* The role's GPU (``role_gpu``, lines 84-91): ``GPU_COORDINATOR`` (default 0) for the
  coordinator; in ``MODE=local`` (one PC, ``COORDINATOR_FABRIC=127.0.0.1``) the others take
  ``GPU_COMPUTE_A/B/C`` (defaults 1, 2, 3); in ``MODE=remote`` each peer is started on GPU
  0 (line 217).  k3desk: :func:`k3desk.core.cluster.sparkinfer_config.rank_gpu`.
* Why each matters, in the engine's v0.2.2 source: ``SPARKINFER_K3_MOE_WEPS`` defaults
  to 0.08 and skips experts whose routing weight is below it, "NOT bit-identical"
  (``kernels/csrc/cuda/kimi_k3/k3_kernels.cu``, ``k3_moe_weps_host``); ``=0`` "restores
  exact main".  ``SPARKINFER_K3_GRAPH=0`` turns CUDA-graph capture off
  (``runtime/src/models/kimi_k3_tp.cpp``); ``docs/OPERATOR-3-AND-4-SPARK.md`` keeps
  "CUDA graph / WEPS" off until eager parity.
* ``evidence/specdec-k8-p8-12tps-RECEIPT.md``: the qualified "K=8/P8" structured profile
  (12.5492 tok/s on repeat-heavy structured text, 6.5893 on prose, matched baseline
  6.4930) = the launcher's flags and environment.  ``evidence/specdec-majority-10tps-
  RECEIPT.md``: "K=4", the lower-width conservative profile (``--spec-draft 4`` with the
  same drafter flags; no ``PROJ_TOKS=8``).  The baseline those receipts bracket against
  runs without drafting, with the common environment (``scripts/spec_draft.sh``, K=0).
* The engine's own checks of these flags (``kimi_k3_dist_generate.cpp`` in patches
  0024, 0025 and 0026): with ``--spec-draft K`` non-zero, K must be in [2, 16]
  (``kMaxStepTokens``), ``1 <= --spec-ngram-min <= --spec-ngram-max``,
  ``--spec-min-occur >= 1``, ``--spec-majority NUM/DEN`` with ``0 <= NUM <= DEN``,
  ``--spec-weak-draft < K``, and ``SPARKINFER_K3_PREFILL_CHUNK`` (``atoi``; unset or not
  positive = 64) ``>= K``; each failure prints a line and exits 2.  :func:`engine_refusals`
  applies exactly these, so k3desk refuses only what the engine would.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RECIPE_REPO = "vcruz305/kimi-k3-neuron-tp3-dgxspark-recipe"
RECIPE_COMMIT = "aab21c4"
PREFILL_CHUNK_ENV = "SPARKINFER_K3_PREFILL_CHUNK"
PREFILL_CHUNK_DEFAULT = 64  # kimi_k3_dist_generate.cpp (patch 0024): `int chunk = 64;`
SPEC_DRAFT_RANGE = (2, 16)  # [2, kMaxStepTokens] (patch 0024)
LAUNCHER_MAX_CTX = 4096  # k3_cluster.sh:49 MAX_CTX=${MAX_CTX:-4096}
LAUNCHER_SPEC_K = 8  # k3_cluster.sh:50 SPEC_K=${SPEC_K:-8}
# the one tier SparkInfer loads: the pruned 9-shard vcruz305 UD-IQ1_S (others are refused:
# "GGUF MoE geometry is not the Neuron 896x1536 recipe target")
SPARKINFER_TIER = "vcruz305-ud-iq1s"

# What every profile exports (the receipts' "common run shape"; k3_cluster.sh:133-136).
# CUDA_VISIBLE_DEVICES is the rank's own (k3_cluster.sh:132, role_gpu): see
# sparkinfer_config.rank_gpu.
COMMON_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "SPARKINFER_K3_MOE_WEPS": "0",
    "SPARKINFER_K3_GRAPH": "0",
    PREFILL_CHUNK_ENV: "16",
}
DRAFTER_ARGS = ("--spec-ngram-min", "1", "--spec-min-occur", "2", "--spec-majority", "2/3")


@dataclass(frozen=True)
class RecipeProfile:
    """One of the recipe's own launch profiles: environment and flags for every rank."""

    name: str
    title: str
    env: Mapping[str, str]
    spec_draft: int | None  # --spec-draft K (None: no speculative decoding)
    spec_args: tuple[str, ...]  # the drafter's flags besides --spec-draft
    source: str  # the recipe file it comes from
    note: str  # what it was measured to do
    # the launcher's ``--spec-ngram-max "$SPEC_K"`` (k3_cluster.sh:129): the n-gram window
    # follows K, so ``--spec-draft 4`` on this profile is the launcher's ``SPEC_K=4``
    ngram_max_follows_k: bool = False

    def args(self, spec_draft: int | None = None) -> list[str]:
        """The flags after ``--max-ctx`` (``spec_draft`` overrides K; 0 turns drafting off)."""
        k = self.spec_draft if spec_draft is None else spec_draft
        if not k:
            return []
        spec = list(self.spec_args)
        if self.ngram_max_follows_k and "--spec-ngram-max" in spec:
            spec[spec.index("--spec-ngram-max") + 1] = str(k)
        return ["--spec-draft", str(k), *spec]


PROFILES: dict[str, RecipeProfile] = {
    p.name: p
    for p in (
        RecipeProfile(
            "k8-p8",
            "K=8/P8 (the recipe's launcher)",
            {**COMMON_ENV, "SPARKINFER_K3_DIST_HEAD_BAND": "1", "SPARKINFER_K3_PROJ_TOKS": "8"},
            8,
            ("--spec-ngram-min", "1", "--spec-ngram-max", "8", *DRAFTER_ARGS[2:]),
            "scripts/k3_cluster.sh; evidence/specdec-k8-p8-12tps-RECEIPT.md",
            "the qualified TP3 profile: 12.55 tok/s on repeat-heavy structured text, "
            "near the 6.49 tok/s baseline on prose",
            ngram_max_follows_k=True,
        ),
        RecipeProfile(
            "k4",
            "K=4 (conservative)",
            {**COMMON_ENV, "SPARKINFER_K3_DIST_HEAD_BAND": "1"},
            4,
            ("--spec-ngram-min", "1", "--spec-ngram-max", "8", *DRAFTER_ARGS[2:]),
            "evidence/specdec-majority-10tps-RECEIPT.md",
            "the lower-width profile: 10.8 tok/s on structured text, 6.5 on prose",
        ),
        RecipeProfile(
            "baseline",
            "baseline (no drafting)",
            dict(COMMON_ENV),
            None,
            (),
            "scripts/spec_draft.sh (K=0); the receipts' matched baseline",
            "plain greedy decoding: 6.49 tok/s on every workload",
        ),
    )
}
DEFAULT_PROFILE = "k8-p8"  # what `k3_cluster.sh start` runs (README: "qualified 12.5 TPS")


def profile_names() -> str:
    return ", ".join(PROFILES)


def _atoi(text: str | None) -> int:
    """C's ``atoi``: optional blanks and sign, then the leading digits; 0 when none."""
    m = re.match(r"\s*([+-]?\d+)", text or "")
    return int(m.group(1)) if m else 0


def _flag(argv: Sequence[str], name: str) -> str | None:
    """The value of the last ``name VALUE`` in ``argv`` (the engine's parser keeps the last)."""
    value = None
    for i, a in enumerate(argv[:-1]):
        if a == name:
            value = argv[i + 1]
    return value


def prefill_chunk(env: Mapping[str, str]) -> int:
    """The prefill chunk the engine will use (patch 0024: atoi, else 64)."""
    v = _atoi(env.get(PREFILL_CHUNK_ENV))
    return v if v > 0 else PREFILL_CHUNK_DEFAULT


def engine_refusals(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """What ``kimi_k3_dist_generate`` would refuse (exit 2) in these flags and this
    environment, each as a sentence; [] when it would start."""
    k = _atoi(_flag(argv, "--spec-draft"))
    if k == 0:  # the checks below run only `if (spec_draft != 0)`
        return []
    lo, hi = SPEC_DRAFT_RANGE
    if not lo <= k <= hi:
        return [f"--spec-draft must be between {lo} and {hi}, not {k}."]
    out: list[str] = []
    n_min = _atoi(_flag(argv, "--spec-ngram-min") or "1")
    n_max = _atoi(_flag(argv, "--spec-ngram-max") or "3")
    if n_min < 1 or n_max < n_min:
        out.append(
            f"--spec-ngram-min {n_min} and --spec-ngram-max {n_max}: the engine needs "
            "1 <= min <= max."
        )
    occur = _flag(argv, "--spec-min-occur")
    if occur is not None and _atoi(occur) < 1:
        out.append(f"--spec-min-occur must be at least 1, not {occur}.")
    majority = _flag(argv, "--spec-majority")
    if majority is not None:
        num, slash, den = majority.partition("/")
        if not slash:
            out.append(f"--spec-majority needs NUM/DEN (for example 2/3), not {majority!r}.")
        elif not (0 <= _atoi(num) <= _atoi(den) and _atoi(den) >= 1):
            out.append(f"--spec-majority {majority}: the engine needs 0 <= NUM <= DEN, DEN >= 1.")
    weak = _atoi(_flag(argv, "--spec-weak-draft"))
    if weak >= k:
        out.append(f"--spec-weak-draft {weak} must be less than --spec-draft {k}.")
    chunk = prefill_chunk(env)
    if chunk < k:
        given = env.get(PREFILL_CHUNK_ENV)
        where = f"{PREFILL_CHUNK_ENV}={given}" if given else f"{PREFILL_CHUNK_ENV} unset"
        out.append(
            f"--spec-draft {k} needs {PREFILL_CHUNK_ENV} >= {k} on every rank, and {where} "
            f"gives a prefill chunk of {chunk}."
        )
    return out


def spec_draft_note(profile: str, spec_draft: int | None) -> str:
    """What ``--spec-draft`` given over ``profile`` runs, in the recipe's words ('' when it
    is the profile's own K or the profile is unknown)."""
    p = PROFILES.get(profile)
    if p is None or spec_draft is None or spec_draft == p.spec_draft:
        return ""
    if not spec_draft:
        return f"--spec-draft 0 turns drafting off: profile {p.name}'s environment, no drafter."
    args = " ".join(p.args(spec_draft)[2:])
    if p.ngram_max_follows_k:
        receipt = " The K=4 receipt's own combination is --profile k4." if spec_draft == 4 else ""
        return (
            f"--spec-draft {spec_draft} on profile {p.name} is the launcher with "
            f"SPEC_K={spec_draft} (k3_cluster.sh:128-129): {args}, with its environment.{receipt}"
        )
    return (
        f"--spec-draft {spec_draft} on profile {p.name} keeps that profile's drafter flags "
        f"({args}); no receipt measured this width."
    )
