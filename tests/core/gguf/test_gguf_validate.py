"""`k3desk validate` and validate_shard_set on sparse twins of every tier, on broken
twins, and on the tiny model the gguf package writes."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import k3desk.cli
from k3desk.app import Services
from k3desk.core.catalog.loader import Catalog
from k3desk.core.errors import Cancelled, ValidationError
from k3desk.core.gguf.ggml import BY_NAME
from k3desk.core.gguf.reader import read_header
from k3desk.core.gguf.validate import inspect_shard_set, validate_shard_set
from k3desk.core.k3arch import REAL_K3, is_expert_tensor, layer_of, tensor_specs
from k3desk.core.progress import CancelToken, Progress
from k3desk.core.units import GiB
from k3desk.devtools.twin import twin_shape
from tests.fixtures.twins import BrokenTwinFactory, TwinFactory

ALL_TIERS = [
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
]

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run `k3desk ARGS` through the real CLI entry point (validate registered)."""
    monkeypatch.setattr(k3desk.cli, "COMMAND_MODULES", ("k3desk.cli.validate",))

    def run(*args: str) -> tuple[int, str, str]:
        rc = k3desk.cli.main(list(args), Services())
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def test_catalog_lists_every_tier(twin_catalog: Catalog) -> None:
    assert sorted(twin_catalog.ids) == sorted(ALL_TIERS)


@pytest.mark.parametrize("tier_id", ALL_TIERS)
def test_validate_passes_on_a_twin_of_every_tier(
    tier_id: str, twin_factory: TwinFactory, twin_catalog: Catalog, cli: Cli
) -> None:
    tier = twin_catalog.get(tier_id)
    parts = twin_factory(tier_id)
    rc, out, err = cli("validate", str(parts[0]))
    assert rc == 0, err
    assert "OK: every part is present" in out
    assert f"Parts:        {tier.shard_count} in" in out
    assert "Layers:       93: 1 dense lead (0) + 92 MoE" in out
    assert "Attention:    69 KDA + 24 MLA" in out
    assert f"Experts:      {tier.experts_kept} per MoE layer, 16 used per token" in out


@pytest.mark.parametrize("tier_id", ALL_TIERS)
def test_layout_is_consistent_with_k3arch(
    tier_id: str, twin_factory: TwinFactory, twin_catalog: Catalog
) -> None:
    tier = twin_catalog.get(tier_id)
    parts = twin_factory(tier_id)
    layout = validate_shard_set(parts[len(parts) // 2])  # any part finds the set
    assert layout.parts == tuple(parts)
    assert [p.name for p in layout.parts] == [Path(n).name for n in tier.shard_names()]
    assert layout.total_file_bytes == pytest.approx(tier.size_bytes, rel=0.01)

    expert = Counter[int]()
    other = Counter[int]()
    global_bytes = 0
    for spec in tensor_specs(twin_shape(tier)):
        t = BY_NAME[tier.type_for(spec.name, spec.role)]
        n = 1
        for d in spec.shape:
            n *= d
        nbytes = n // t.block_size * t.type_size
        layer = layer_of(spec.name)
        if layer is None:
            global_bytes += nbytes
        elif is_expert_tensor(spec.name):
            expert[layer] += nbytes
        else:
            other[layer] += nbytes
    assert layout.global_bytes == global_bytes
    for lay in layout.layers:
        assert lay.expert_bytes == expert[lay.index], lay.index
        assert lay.other_bytes == other[lay.index], lay.index
        assert lay.attention == ("mla" if REAL_K3.is_mla(lay.index) else "kda")
        assert lay.ffn == ("dense" if lay.index == 0 else "moe")
    assert layout.layers[0].expert_bytes == 0
    hp = layout.hparams
    assert hp.expert_count == tier.experts_kept
    assert hp.expert_feed_forward_length == tier.expert_feed_forward_length
    assert hp.block_count == 93
    assert hp.vocab_size == 163_840
    assert layout.tensor_count == 2573
    assert len(layout.tensors) == 2573
    assert sum(t.nbytes for t in layout.tensors) == layout.total_tensor_bytes


def test_grearl_twin_reproduces_the_card(twin_factory: TwinFactory) -> None:
    layout = validate_shard_set(twin_factory("grearl-iq1s")[0])
    # "Type distribution: IQ1_S 276 / Q4_K 1067 / F32 1112 / F16 117 / Q8_0 1"
    assert layout.type_counts == {"IQ1_S": 276, "Q4_K": 1067, "F32": 1112, "F16": 117, "Q8_0": 1}
    # "ffn_{gate,up,down}_exps ... IQ1_S ... 495.26 GiB"
    assert layout.expert_bytes / GiB == pytest.approx(495.26, abs=0.01)
    assert layout.total_file_bytes / GiB == pytest.approx(528.0293, abs=0.0001)


def test_6block_promoted_layers_show_in_per_layer_bytes(twin_factory: TwinFactory) -> None:
    xs = validate_shard_set(twin_factory("6block-iq1s-xs")[0])
    xxs = validate_shard_set(twin_factory("6block-iq1s-xxs-832e")[0])
    assert {xs.layers[i].expert_bytes for i in range(1, 11)} == {xs.layers[1].expert_bytes}
    assert xs.layers[1].expert_bytes > xs.layers[11].expert_bytes
    # pruning 64 of 896 experts removes exactly 64/896 of every expert tensor
    assert xxs.layers[50].expert_bytes * 896 == xs.layers[50].expert_bytes * 832
    assert (xs.expert_bytes - xxs.expert_bytes) / GiB == pytest.approx(36.4, abs=0.5)


def test_validate_json(twin_factory: TwinFactory, cli: Cli) -> None:
    rc, out, _ = cli("validate", str(twin_factory("vcruz305-ud-iq1s")[3]), "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["ok"] is True
    assert len(data["parts"]) == 9
    assert len(data["layers"]) == 93
    assert data["hparams"]["expert_feed_forward_length"] == 1536
    assert data["expert_bytes"] + data["non_expert_bytes"] == data["total_tensor_bytes"]


BROKEN = [
    ("missing-part", "Part 00005-of-00009 of Kimi-K3-UD-IQ1_S is missing",
     "k3desk download vcruz305-ud-iq1s"),
    ("truncated", "(Kimi-K3-UD-IQ1_S-00005-of-00009.gguf) is truncated",
     "Delete it and download it again with `k3desk download vcruz305-ud-iq1s`"),
    ("truncated-header", "Part 00005-of-00009: Kimi-K3-UD-IQ1_S-00005-of-00009.gguf ends inside "
     "its GGUF header", "Delete it and download it again"),
    ("split-count", "says split.count = 8, but its name and the set say 9 parts",
     "k3desk download vcruz305-ud-iq1s"),
    ("wrong-arch", "is a 'kimi-k9' model, not Kimi-K3", "k3desk tiers"),
    ("not-gguf", "Kimi-K3-UD-IQ1_S-00005-of-00009.gguf is not a GGUF file", "download it again"),
    ("duplicate-tensor", "also in part 00004-of-00009", "k3desk download vcruz305-ud-iq1s"),
    ("missing-key", "lacks the key kimi-k3.attn_res.block_size", "current conversion"),
    ("expert-count", "has shape [7168, 896], but the file's own hyper-parameters call for "
     "[7168, 832]", "llama.cpp will refuse it"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "message", "hint"), BROKEN, ids=[b[0] for b in BROKEN])
def test_each_broken_twin_fails_with_its_own_message(
    kind: str,
    message: str,
    hint: str,
    broken_twin: BrokenTwinFactory,
    tmp_path: Path,
    cli: Cli,
) -> None:
    parts, _ = broken_twin("vcruz305-ud-iq1s", kind, tmp_path)  # type: ignore[arg-type]
    rc, out, err = cli("validate", str(parts[0]))
    assert rc == 1
    assert out == ""
    first, _, rest = err.partition("\n")
    assert first.startswith("error: ")
    assert message in first
    assert hint in rest
    assert "Traceback" not in err


def test_broken_twin_json_failure(broken_twin: BrokenTwinFactory, tmp_path: Path, cli: Cli) -> None:
    parts, _ = broken_twin("vcruz305-ud-iq1s", "missing-part", tmp_path)
    rc, out, _ = cli("validate", str(parts[0]), "--json")
    assert rc == 1
    data = json.loads(out)
    assert data["ok"] is False
    assert "00005-of-00009" in data["error"]
    assert "k3desk download vcruz305-ud-iq1s" in data["hint"]


def test_missing_part_of_unknown_set_gives_generic_advice(
    broken_twin: BrokenTwinFactory, tmp_path: Path
) -> None:
    parts, _ = broken_twin("vcruz305-ud-iq1s", "missing-part", tmp_path)
    renamed = [p.rename(p.with_name(p.name.replace("UD-IQ1_S", "Mine"))) for p in parts[:4]]
    with pytest.raises(ValidationError) as err:
        validate_shard_set(renamed[0])  # no catalog passed, and no tier matches anyway
    assert "Parts 00005-of-00009, 00006-of-00009" in err.value.message
    assert "(5 of 9;" in err.value.message
    assert "all 9 parts must sit together" in err.value.hint


def _head(path: Path, n: int) -> bytes:
    with path.open("rb") as f:
        return f.read(n)


def test_invalid_split_names(twin_factory: TwinFactory, tmp_path: Path) -> None:
    bad = tmp_path / "Kimi-K3-UD-IQ1_S-00000-of-00009.gguf"
    os.link(twin_factory("vcruz305-ud-iq1s")[0], bad)  # part 1 under a name no part has
    with pytest.raises(ValidationError, match="invalid split file name"):
        validate_shard_set(bad)
    cut = tmp_path / "Kimi-K3-UD-IQ1_S-00010-of-00009.gguf"
    cut.write_bytes(_head(bad, 1024))  # what llama.cpp reads first is the header: cut
    with pytest.raises(ValidationError, match="ends inside its GGUF header"):
        validate_shard_set(cut)
    with pytest.raises(ValidationError, match="does not exist"):
        validate_shard_set(tmp_path / "nothing-00001-of-00002.gguf")
    with pytest.raises(ValidationError, match="is a folder"):
        validate_shard_set(tmp_path)


def test_a_file_not_named_gguf_is_judged_by_its_content(
    twin_factory: TwinFactory, tmp_path: Path, cli: Cli
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    rc, out, err = cli("validate", str(notes))
    assert out == ""
    assert rc == 1
    assert "notes.txt is not a GGUF file" in err
    assert "missing" not in err
    lone = tmp_path / "kimi.bin"
    part2 = twin_factory("vcruz305-ud-iq1s")[1]
    lone.write_bytes(_head(part2, read_header(part2).data_start))
    with pytest.raises(ValidationError, match="part of a 9-part set"):
        validate_shard_set(lone)


def test_split_part_renamed_to_an_unsplit_name(twin_factory: TwinFactory, tmp_path: Path) -> None:
    lone = tmp_path / "kimi.gguf"
    part2 = twin_factory("vcruz305-ud-iq1s")[1]
    lone.write_bytes(_head(part2, read_header(part2).data_start))
    with pytest.raises(ValidationError, match="part of a 9-part set"):
        validate_shard_set(lone)


def test_progress_and_cancel(twin_factory: TwinFactory) -> None:
    seen: list[Progress] = []
    validate_shard_set(twin_factory("grearl-iq1s")[0], progress=seen.append)
    assert seen[-1].done == seen[-1].total == 94
    assert len(seen) == 95
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        validate_shard_set(twin_factory("grearl-iq1s")[0], cancel=token)


def test_94_parts_validate_in_well_under_a_second(twin_factory: TwinFactory) -> None:
    parts = twin_factory("grearl-iq1s")
    validate_shard_set(parts[0])  # page cache warm, as after a download
    t0 = time.perf_counter()
    report = inspect_shard_set(parts[0])
    elapsed = time.perf_counter() - t0
    assert report.layout.tensor_count == 2573
    # about 0.07 s measured, 0.1-0.2 s more since part 1's 163,840 tokens are checked for
    # duplicates; generous for a busy 2-core machine
    assert elapsed < 1.0


def test_the_gguf_packages_tiny_model_validates(tmp_path: Path) -> None:
    from k3desk.core.engines.canary import write_k3_gguf

    parts = write_k3_gguf(tmp_path / "split", "Tiny-K3-IQ1_S", shards=3)
    layout = validate_shard_set(parts[1])
    assert layout.parts == tuple(parts)
    assert layout.hparams.expert_count == 8
    assert [lay.attention for lay in layout.layers] == ["kda", "kda", "mla", "kda", "kda", "mla"]
    assert layout.layers[0].ffn == "dense"
    assert all(lay.expert_bytes > 0 for lay in layout.layers[1:])
    (single,) = write_k3_gguf(tmp_path / "one", "Tiny-K3-F16", shards=1)
    assert validate_shard_set(single).parts == (single,)
