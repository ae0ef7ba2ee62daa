"""Layouts estimated from the catalog, before any file is downloaded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from k3desk.core.catalog.loader import Catalog
from k3desk.core.errors import PlanError
from k3desk.core.gguf.model import ModelLayout
from k3desk.core.planning.estimate import estimate_layout
from k3desk.core.units import GiB

Layout = Callable[[str], ModelLayout]


def test_every_tier_estimate_matches_its_published_size(twin_catalog: Catalog) -> None:
    for tier in twin_catalog:
        layout = estimate_layout(tier)
        assert layout.total_tensor_bytes == tier.size_bytes, tier.id
        assert len(layout.layers) == 93
        assert layout.tensor_count == 2573
        assert len(layout.tensors) == 2573
        assert layout.hparams.expert_count == tier.experts_kept
        moe = layout.moe_layers
        assert len(moe) == 92
        assert layout.layers[0].ffn == "dense"
        # the routed experts dominate every tier (81 % in the narrowed one)
        assert layout.expert_bytes > 0.8 * layout.total_tensor_bytes, tier.id


def test_grearl_types_match_the_quantization_mix_on_its_card(twin_catalog: Catalog) -> None:
    layout = estimate_layout(twin_catalog.get("grearl-iq1s"))
    per_type: dict[str, int] = {}
    for t in layout.tensors:
        per_type[t.type_name] = per_type.get(t.type_name, 0) + t.nbytes
    # GrEarl's card: IQ1_S 276 tensors 495.26 GiB, Q4_K 1,067 28.58 GiB,
    # Q8_0 1 (output) 1.16 GiB, F32 1,112 2.25 GiB, F16 117 0.76 GiB
    assert layout.type_counts == {"IQ1_S": 276, "Q4_K": 1067, "Q8_0": 1, "F32": 1112, "F16": 117}
    for name, gib in {
        "IQ1_S": 495.26,
        "Q4_K": 28.58,
        "Q8_0": 1.16,
        "F32": 2.25,
        "F16": 0.76,
    }.items():
        assert per_type[name] / GiB == pytest.approx(gib, rel=0.02), name


def test_estimate_agrees_with_the_headers_of_the_twin(
    estimated: Layout, twin_layout: Layout
) -> None:
    for tier_id in ("grearl-iq1s", "6block-iq1s-xs"):
        est, real = estimated(tier_id), twin_layout(tier_id)
        assert est.type_counts == real.type_counts
        for a, b in zip(est.layers, real.layers, strict=True):
            assert a.other_bytes == b.other_bytes
            assert a.expert_bytes == pytest.approx(b.expert_bytes, rel=0.001)


def test_pruned_and_narrowed_tiers_keep_their_geometry(twin_catalog: Catalog) -> None:
    pruned = estimate_layout(twin_catalog.get("6block-iq1s-xxs-832e"))
    assert pruned.hparams.expert_count == 832
    narrow = estimate_layout(twin_catalog.get("vcruz305-ud-iq1s"))
    assert narrow.hparams.expert_feed_forward_length == 1536
    # Q8_0 non-experts: about twice GrEarl's Q4_K ones
    grearl = estimate_layout(twin_catalog.get("grearl-iq1s"))
    non_expert = narrow.total_tensor_bytes - narrow.expert_bytes
    assert non_expert > 1.6 * (grearl.total_tensor_bytes - grearl.expert_bytes)


def test_a_bad_type_or_expert_count_is_reported_with_the_tier(twin_catalog: Catalog) -> None:
    tier = twin_catalog.get("grearl-iq1s")
    bad = replace(tier, tensor_types={**tier.tensor_types, "attn": "Q4_KK"})
    with pytest.raises(PlanError, match=r"Unknown ggml type 'Q4_KK' in tier grearl-iq1s"):
        estimate_layout(bad)
    with pytest.raises(PlanError, match="keeps 8 experts"):
        estimate_layout(replace(tier, experts_kept=8))
