"""Shard-set discovery by name, and the sparse twins themselves."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3desk.core.catalog.loader import Catalog
from k3desk.core.gguf.reader import read_header
from k3desk.core.gguf.shards import discover
from k3desk.devtools.twin import write_twin
from tests.fixtures.twins import TwinFactory

REPO = Path(__file__).resolve().parents[3]


def test_discover_from_any_part() -> None:
    s = discover("/m/K3/IQ1_S/Kimi-K3-IQ1_S-00007-of-00014.gguf")
    assert s.count == 14
    assert s.given_index == 6
    assert s.split
    assert s.paths[0] == Path("/m/K3/IQ1_S/Kimi-K3-IQ1_S-00001-of-00014.gguf")
    assert s.paths[-1].name == "Kimi-K3-IQ1_S-00014-of-00014.gguf"
    assert s.part_label(6) == "00007-of-00014"
    # names that only look split in their prefix keep it
    s = discover("Kimi-K3-IQ1_S-XXS-832e-00001-of-00011.gguf")
    assert s.prefix == "Kimi-K3-IQ1_S-XXS-832e"


def test_discover_unsplit_file() -> None:
    s = discover("/m/kimi-k3-Q2_K.gguf")
    assert not s.split
    assert s.count == 1
    assert s.paths == (Path("/m/kimi-k3-Q2_K.gguf"),)
    # a file named without .gguf is itself, not part 1 of "<name>-00001-of-00001.gguf"
    s = discover("/m/notes.txt")
    assert not s.split
    assert s.paths == (Path("/m/notes.txt"),)
    assert s.missing() == [0]


def test_twin_is_sparse_and_balanced(twin_factory: TwinFactory, twin_catalog: Catalog) -> None:
    tier = twin_catalog.get("grearl-iq1s")
    parts = twin_factory("grearl-iq1s")
    assert len(parts) == 94
    sizes = [p.stat().st_size for p in parts]
    assert sum(sizes) == tier.size_bytes
    allocated = sum(p.stat().st_blocks * 512 for p in parts)
    assert allocated < 64 * 1024**2  # 528 GiB apparent, a few MiB on disk
    mean = sum(sizes) / len(sizes)
    assert max(sizes) < 1.5 * mean
    assert min(sizes) > 0.5 * mean
    # tensors are split in llama-quantize's order: globals, then by layer and name
    names = [t.name for p in parts for t in read_header(p).tensors]
    assert names[:4] == [
        "output.weight", "output_norm.weight", "output_res_score.weight", "token_embd.weight"
    ]  # fmt: skip
    assert names[-1] == "blk.92.ffn_up_shexp.weight"
    assert names.index("blk.10.attn_norm.weight") < names.index("blk.11.attn_norm.weight")
    assert names.index("blk.9.ssm_g.weight") < names.index("blk.10.attn_norm.weight")


def test_twin_parts_carry_split_keys(twin_factory: TwinFactory) -> None:
    parts = twin_factory("6block-iq1s-xxs-832e")
    for i, p in enumerate(parts):
        h = read_header(p)
        assert h.kv["split.no"] == i
        assert h.kv["split.count"] == 11
        assert h.kv["split.tensors.count"] == 2573
        assert h.version == 3
        assert h.alignment == 32
        assert ("general.architecture" in h.kv) == (i == 0)
    h0 = read_header(parts[0])
    assert h0.kv["kimi-k3.expert_count"] == 832
    assert h0.kv["general.architecture"] == "kimi-k3"


def test_writing_the_94_part_twin_is_fast(tmp_path: Path, twin_catalog: Catalog) -> None:
    t0 = time.perf_counter()
    parts = write_twin(twin_catalog.get("grearl-iq1s"), tmp_path)
    assert len(parts) == 94
    assert time.perf_counter() - t0 < 5.0  # about 0.1 s measured


def test_twin_of_a_subfolder_tier_keeps_repo_paths(tmp_path: Path, twin_catalog: Catalog) -> None:
    parts = write_twin(twin_catalog.get("atomicchat-iq1s"), tmp_path)
    assert parts[0] == tmp_path / "IQ1_S" / "Kimi-K3-IQ1_S-00001-of-00014.gguf"


def test_devtools_twin_command(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "k3desk.devtools", "twin", "vcruz305-ud-iq1s", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    listed = out.stdout.split()
    assert listed[0].endswith("Kimi-K3-UD-IQ1_S-00001-of-00009.gguf")
    assert len(listed) == 9
    bad = subprocess.run(
        [sys.executable, "-m", "k3desk.devtools", "twin", "no-such-tier", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 1
    assert "Unknown tier 'no-such-tier'" in bad.stderr


def test_twin_refuses_types_far_over_the_published_size(
    tmp_path: Path, twin_catalog: Catalog
) -> None:
    from dataclasses import replace

    tier = twin_catalog.get("grearl-iq1s")
    bloated = replace(tier, tensor_types={**tier.tensor_types, "experts": "Q8_0"})
    with pytest.raises(ValueError, match="more than 1 % over the published"):
        write_twin(bloated, tmp_path)


def test_catalog_names_its_shards_as_discovery_finds_them() -> None:
    """One parser: the names a tier downloads are the parts discovery expects beside part 1."""
    from k3desk.core.catalog.loader import load_catalog
    from k3desk.core.gguf.shards import parse_split_name, split_part_names
    from k3desk.core.resources import resources_dir

    split = 0
    for tier in load_catalog(resources_dir() / "catalog.json"):
        names = tier.shard_names()
        assert len(names) == tier.shard_count
        found = discover(Path("/dl") / tier.first_shard)
        assert [p.relative_to("/dl").as_posix() for p in found.paths] == names
        split += tier.shard_count > 1
    assert split > 3
    # a repo path keeps its folder; a later part names only itself
    parsed = parse_split_name("UD-IQ1_S/Kimi-K3-UD-IQ1_S-00002-of-00009.gguf")
    assert parsed is not None
    assert (parsed.prefix, parsed.number, parsed.count) == ("UD-IQ1_S/Kimi-K3-UD-IQ1_S", 2, 9)
    assert split_part_names("UD-IQ1_S/Kimi-K3-UD-IQ1_S-00002-of-00009.gguf") == [
        "UD-IQ1_S/Kimi-K3-UD-IQ1_S-00002-of-00009.gguf"
    ]
    assert parse_split_name("Kimi-K3-00001-of-9.gguf") is None
