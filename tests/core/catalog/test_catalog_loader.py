"""The tier catalog: the shipped data is valid, and bad data is reported precisely."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from k3desk.core.catalog.loader import Catalog, load_catalog
from k3desk.core.catalog.model import ROLES
from k3desk.core.errors import CatalogError
from k3desk.core.resources import resources_dir
from k3desk.core.units import GB, GiB, TiB

CATALOG = resources_dir() / "catalog.json"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(CATALOG)


def _raw() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CATALOG.read_text(encoding="utf-8"))
    return data


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    p = tmp_path / "catalog.json"
    p.write_text(json.dumps(data), encoding="utf-8")
    return p


def test_every_published_tier_is_listed(catalog: Catalog) -> None:
    assert set(catalog.ids) == {
        "vcruz305-ud-iq1s",
        "grearl-iq1s",
        "6block-iq1s-xs",
        "6block-iq1s-xxs-832e",
        "atomicchat-iq1s",
        "atomicchat-iq1m",
        "atomicchat-iq2xxs",
        "atomicchat-q3ks",
        "atomicchat-q8_0",
        "unsloth-ud-q8kxl",
    }


def test_trailing_dash_keeps_xs_from_selecting_xxs(catalog: Catalog) -> None:
    listing = [
        "Kimi-K3-IQ1_S-XS-00001-of-00034.gguf",
        "Kimi-K3-IQ1_S-XS-00034-of-00034.gguf",
        "Kimi-K3-IQ1_S-XXS-832e-00001-of-00011.gguf",
        "Kimi-K3-IQ1_S-XXS-832e-00011-of-00011.gguf",
        "Kimi-K3-mmproj-BF16.gguf",
        "README.md",
    ]
    xs = catalog.get("6block-iq1s-xs")
    xxs = catalog.get("6block-iq1s-xxs-832e")
    assert xs.select_files(listing) == listing[:2]
    assert xxs.select_files(listing) == listing[2:4]
    assert xs.select_files(listing, with_mmproj=True) == [*listing[:2], "Kimi-K3-mmproj-BF16.gguf"]
    assert not xs.matches("Kimi-K3-IQ1_S-XXS-832e-00001-of-00011.gguf")
    # The card warns that '*IQ1_S-XS*' would also pick the XXS files.  Under fnmatch it
    # does not ("IQ1_S-XS" is no substring of "IQ1_S-XXS"); the catalog records that
    # rather than repeating the warning.  The dash still rejects other XS-prefixed names.
    undashed = xs.__class__(**{**xs.__dict__, "include": ("*IQ1_S-XS*",)})
    assert undashed.select_files(listing) == listing[:2]
    assert undashed.matches("Kimi-K3-IQ1_S-XSmall-00001-of-00002.gguf")
    assert not xs.matches("Kimi-K3-IQ1_S-XSmall-00001-of-00002.gguf")
    assert any("trailing dash" in c and "does not" in c for c in xs.caveats)


def test_atomicchat_tiers_do_not_select_each_other(catalog: Catalog) -> None:
    listing = [
        name
        for tid in ("atomicchat-iq1s", "atomicchat-iq1m", "atomicchat-iq2xxs", "atomicchat-q3ks")
        for name in catalog.get(tid).shard_names()
    ] + ["mmproj-F16.gguf", "mmproj-BF16.gguf"]
    for tid in ("atomicchat-iq1s", "atomicchat-iq1m", "atomicchat-iq2xxs", "atomicchat-q3ks"):
        tier = catalog.get(tid)
        assert tier.select_files(listing) == tier.shard_names()
    assert catalog.get("atomicchat-iq1s").select_files(listing, with_mmproj=True)[-2:] == [
        "mmproj-F16.gguf",
        "mmproj-BF16.gguf",
    ]


def test_first_shard_matches_patterns_and_shard_count(catalog: Catalog) -> None:
    for tier in catalog:
        m = re.fullmatch(r"(?:.*/)?[^/]+-00001-of-(\d{5})\.gguf", tier.first_shard)
        assert m, tier.id
        assert int(m.group(1)) == tier.shard_count, tier.id
        names = tier.shard_names()
        assert len(names) == tier.shard_count
        assert names[0] == tier.first_shard
        assert names[-1].endswith(f"-{tier.shard_count:05d}-of-{tier.shard_count:05d}.gguf")
        assert tier.select_files(names) == names, tier.id


def test_sizes_are_the_published_ones(catalog: Catalog) -> None:
    assert catalog.get("vcruz305-ud-iq1s").size_bytes == 330_167_807_328
    assert catalog.get("vcruz305-ud-iq1s").size_exact
    assert catalog.get("grearl-iq1s").size_bytes == pytest.approx(528.0293 * GiB, abs=GiB / 10**4)
    assert catalog.get("6block-iq1s-xs").size_bytes == pytest.approx(539.7 * GiB, rel=1e-4)
    assert catalog.get("6block-iq1s-xxs-832e").size_bytes == pytest.approx(503.3 * GiB, rel=1e-4)
    # AtomicChat states GB in one table and GiB in another: both must agree with ours
    for tid, gb, gib in (
        ("atomicchat-iq1s", 590, 549),
        ("atomicchat-iq1m", 690, 643),
        ("atomicchat-iq2xxs", 769, 717),
        ("atomicchat-q3ks", 1197, 1115),
    ):
        size = catalog.get(tid).size_bytes
        assert size == pytest.approx(gb * GB, abs=1 * GB), tid
        assert size == pytest.approx(gib * GiB, abs=1 * GiB), tid
    assert catalog.get("atomicchat-q8_0").size_bytes == 2955 * GB
    assert catalog.get("unsloth-ud-q8kxl").size_bytes == pytest.approx(1.5 * TiB)


def test_sizes_are_plausible_for_their_types(catalog: Catalog) -> None:
    # 2.72 T routed-expert parameters at the expert type set a floor; nothing is
    # ever 3x the expert payload
    bpw = {"IQ1_S": 1.5625, "IQ1_M": 1.75, "IQ2_XXS": 2.0625, "Q3_K": 3.4375, "Q8_0": 8.5,
           "MXFP4": 4.25}  # fmt: skip
    for tier in catalog:
        expert_params = 3 * 3584 * tier.expert_feed_forward_length * tier.experts_kept * 92
        floor = expert_params * bpw[tier.expert_quant] / 8
        assert floor < tier.size_bytes < 1.25 * floor, tier.id
    sizes = [catalog.get(t).size_bytes for t in ("atomicchat-iq1s", "atomicchat-iq1m",
             "atomicchat-iq2xxs", "atomicchat-q3ks", "atomicchat-q8_0")]  # fmt: skip
    assert sizes == sorted(sizes)


def test_unknowns_are_marked_and_explained(catalog: Catalog) -> None:
    for tier in catalog:
        if "shard_count" in tier.derived or "first_shard" in tier.derived:
            assert not tier.known, tier.id
            assert any("not stated" in c or "assumed" in c for c in tier.caveats), tier.id
    assert catalog.get("grearl-iq1s").known
    assert not catalog.get("atomicchat-iq1m").known
    assert catalog.get("atomicchat-iq1s").shard_count == 14


def test_card_facts_that_matter_for_running(catalog: Catalog) -> None:
    grearl = catalog.get("grearl-iq1s")
    assert grearl.imatrix is False
    assert grearl.manifest == "manifest.json"
    assert "manifest.json" in grearl.select_files(["manifest.json", grearl.first_shard])
    assert catalog.get("6block-iq1s-xxs-832e").experts_kept == 832
    vc = catalog.get("vcruz305-ud-iq1s")
    assert vc.engines == ("sparkinfer", "llama.cpp")
    assert vc.mmproj == ()
    assert any("H200" in e and "Hopper" in e for e in vc.card_errata)
    assert any("sparkinfer" in e and "kimi_k3_dist_generate" in e for e in vc.card_errata)
    for tier in catalog:
        assert set(tier.tensor_types) == set(ROLES), tier.id
        assert "--no-warmup" in tier.extra_args, tier.id
        if tier.mmproj:
            assert tier.vision == "fork", tier.id  # upstream has no K3 vision tower
    assert catalog.get("atomicchat-iq1s").mmproj == ("mmproj-F16.gguf", "mmproj-BF16.gguf")
    assert catalog.get("6block-iq1s-xs").mmproj == ("Kimi-K3-mmproj-BF16.gguf",)
    assert catalog.get("atomicchat-q8_0").reference
    assert catalog.get("unsloth-ud-q8kxl").reference


def test_speed_reports_keep_their_conditions(catalog: Catalog) -> None:
    xs = {(s.tokens_per_s, s.subject != "") for s in catalog.get("6block-iq1s-xs").speeds}
    assert xs == {(6.8, False), (11.5, True)}  # 11.5 tok/s was measured on unsloth's file
    grearl = catalog.get("grearl-iq1s").speeds
    assert any(s.tokens_per_s == 5.0 and not s.verified and "512 GB" in s.hardware for s in grearl)
    ac = {s.tokens_per_s for s in catalog.get("atomicchat-iq1s").speeds if s.kind == "decode"}
    assert ac == {1.82}
    assert {s.tokens_per_s for s in catalog.get("atomicchat-q3ks").speeds} == {1.70, 10.91}
    assert all("not comparable" in t.quality_caveat.lower() or not t.quality for t in catalog)


def test_to_json_list_round_trips(catalog: Catalog) -> None:
    data = catalog.to_json_list()
    text = json.dumps(data)
    back = json.loads(text)
    assert [t["id"] for t in back] == list(catalog.ids)
    assert back[0]["include"] == list(catalog.tiers[0].include)


def test_unknown_tier_id_lists_the_valid_ones(catalog: Catalog) -> None:
    with pytest.raises(CatalogError) as err:
        catalog.get("6block-iq1s-xl")
    assert "6block-iq1s-xl" in err.value.message
    assert "6block-iq1s-xs" in err.value.hint
    assert "grearl-iq1s" in err.value.hint


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.pop("shard_count"), "tier 'grearl-iq1s', field 'shard_count': missing"),
        (lambda t: t.update(shards=3), "tier 'grearl-iq1s': unknown field(s) 'shards'"),
        (lambda t: t.update(shard_count=93), "field 'shard_count': 93 disagrees"),
        (lambda t: t.update(size_bytes="528 GiB"), "field 'size_bytes': expected an integer"),
        (lambda t: t.update(include=["*Q4_K*"]), "field 'include': the patterns"),
        (lambda t: t["tensor_types"].pop("router"), "no type for role(s) router"),
        (lambda t: t["tensor_types"].update(experts="IQ9"), "unknown ggml type 'IQ9'"),
        (lambda t: t.update(vision="maybe"), "field 'vision'"),
        (lambda t: t.update(engines=["ollama"]), "unknown engine 'ollama'"),
        (
            lambda t: t.update(vision="fork", vision_engine="unslot"),
            "tier 'grearl-iq1s', field 'vision_engine': 'unslot' is not a fork k3desk can "
            "build (known forks: unsloth, atomicchat)",
        ),
        (lambda t: t["speeds"][0].update(kind="tg"), "speeds[0], field 'kind'"),
        (lambda t: t["speeds"][0].update(tok=1), "speeds[0]: unknown field(s) 'tok'"),
    ],
)
def test_bad_tier_data_names_tier_and_field(tmp_path: Path, edit: Any, expected: str) -> None:
    data = _raw()
    tier = next(t for t in data["tiers"] if t["id"] == "grearl-iq1s")
    edit(tier)
    with pytest.raises(CatalogError) as err:
        load_catalog(_write(tmp_path, data))
    assert expected in str(err.value)


def test_duplicate_ids_and_broken_files(tmp_path: Path) -> None:
    data = _raw()
    data["tiers"].append(data["tiers"][0])
    with pytest.raises(CatalogError, match="appears twice"):
        load_catalog(_write(tmp_path, data))
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json", encoding="utf-8")
    with pytest.raises(CatalogError, match=r"bad\.json is not valid JSON"):
        load_catalog(bad)
    with pytest.raises(CatalogError, match="does not exist"):
        load_catalog(tmp_path / "missing.json")
