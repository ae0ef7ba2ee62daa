"""Tiny random-weight Kimi-K3 models that the real llama-server serves.

``python -m k3desk.devtools tiny-k3 DIR [--shards N] [--mmproj] [--wide]`` writes
a kimi-k3 GGUF of well under 1 MiB (6 layers, 8 routed experts, KDA + MLA
attention, latent MoE, a 512-token byte-level BPE vocabulary and the Kimi-K3
chat template), optionally split into N parts and with a tiny LLaVA-style
vision projector.  Weights are random (seeded): the output is gibberish, but
every code path from loading to streaming a chat answer is the real one.

``--wide`` writes the same model with rows of 256 values (``TINY_K3_WIDE``,
about 15 MB at F16), so that llama.cpp's ``llama-quantize`` turns it into real
k-quant and i-quant files instead of falling back to other types.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from k3desk.core.engines.canary import write_k3_gguf, write_mlp_projector
from k3desk.core.k3arch import TINY_K3, TINY_K3_WIDE

TEMPLATE_FILE = Path(__file__).with_name("templates") / "Kimi-K3.jinja"
DEFAULT_NAME = "Tiny-K3-IQ1_S"


@dataclass(frozen=True)
class TinyModel:
    name: str
    parts: tuple[Path, ...]  # in split order; parts[0] is what -m takes
    mmproj: Path | None

    @property
    def first_part(self) -> Path:
        return self.parts[0]

    @property
    def total_bytes(self) -> int:
        extra = self.mmproj.stat().st_size if self.mmproj else 0
        return sum(p.stat().st_size for p in self.parts) + extra


def kimi_k3_template() -> str:
    """The Kimi-K3 chat template as llama.cpp b11434 ships it (models/templates/)."""
    return TEMPLATE_FILE.read_text(encoding="utf-8")


def write_tiny_k3(
    directory: str | Path,
    shards: int = 1,
    mmproj: bool = False,
    name: str = DEFAULT_NAME,
    seed: int = 0,
    wide: bool = False,
) -> TinyModel:
    """Write the tiny model (and optionally its projector) into ``directory``."""
    d = Path(directory)
    shape = TINY_K3_WIDE if wide else TINY_K3
    parts = write_k3_gguf(
        d, name, shape=shape, shards=shards, chat_template=kimi_k3_template(), seed=seed
    )
    proj = None
    if mmproj:
        proj = write_mlp_projector(d / f"mmproj-{name}-F16.gguf", shape.n_embd, seed=seed + 1)
    return TinyModel(name=name, parts=parts, mmproj=proj)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3desk.devtools tiny-k3",
        description="Write a tiny random-weight kimi-k3 GGUF that llama-server can serve.",
    )
    parser.add_argument("dir", type=Path, help="folder to write into (created if missing)")
    parser.add_argument("--shards", type=int, default=1, help="number of split parts (default 1)")
    parser.add_argument("--mmproj", action="store_true", help="also write a tiny vision projector")
    parser.add_argument(
        "--name", default=DEFAULT_NAME, help=f"file name stem (default {DEFAULT_NAME})"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--wide",
        action="store_true",
        help="rows of 256 values (about 15 MB), so llama-quantize's k- and i-quants apply",
    )
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    try:
        model = write_tiny_k3(
            args.dir,
            shards=args.shards,
            mmproj=args.mmproj,
            name=args.name,
            seed=args.seed,
            wide=args.wide,
        )
    except (OSError, ValueError) as exc:
        parser.exit(1, f"error: {exc}\n")
    for p in model.parts:
        print(p)
    if model.mmproj:
        print(model.mmproj)
    return 0
