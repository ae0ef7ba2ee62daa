"""Header twins of the SparkInfer recipe model: the right keys and split layout, tiny data.

The pruned vcruz305 tier is 330 GB; what the cluster code and the SparkInfer
stand-in look at is the GGUF header (architecture, expert count and width,
split numbering) and that every part is there and untruncated.  These files
have exactly that, with one small tensor per part.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np

RECIPE_NAMES = tuple(f"Kimi-K3-UD-IQ1_S-{i:05d}-of-00009.gguf" for i in range(1, 10))


def write_recipe_twin(
    folder: Path,
    names: list[str] | tuple[str, ...] = RECIPE_NAMES,
    *,
    expert_count: int = 896,
    expert_feed_forward_length: int = 1536,
    architecture: str = "kimi-k3",
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    m = re.fullmatch(r"(.*)-00001-of-(\d{5})\.gguf", names[0])
    parts = len(names)
    stem = m.group(1) if m else names[0].removesuffix(".gguf")
    writer = gguf.GGUFWriter(
        folder / f"{stem}.gguf", architecture, split_max_tensors=1 if parts > 1 else 0
    )
    k = f"{architecture}."
    writer.add_name("Kimi-K3 recipe twin")
    writer.add_uint32(k + "block_count", 93)
    writer.add_uint32(k + "embedding_length", 7168)
    writer.add_uint32(k + "expert_count", expert_count)
    writer.add_uint32(k + "expert_used_count", 16)
    writer.add_uint32(k + "expert_feed_forward_length", expert_feed_forward_length)
    rng = np.random.default_rng(0)
    for i in range(parts):
        writer.add_tensor(f"twin.part{i}.weight", rng.standard_normal(64).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    paths = [folder / n for n in names]
    missing = [p.name for p in paths if not p.is_file()]
    assert not missing, f"twin parts not written as expected: {missing}"
    return paths
